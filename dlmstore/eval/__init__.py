"""Evaluation: does the adapter know what the document teaches?

DLM's evaluation, carried over and made machine-scored:

* :mod:`.split` - the validation split, a pure function of the row keys and
  the seed (DLM's rule: a sha256 bucket against ``val_frac * 2**64``);
* :mod:`.early_stop` - DLM's eval cadence and early stopping (patience 3);
* :mod:`.probes` - DLM's probes: ``### Q !probe`` pairs, else a seeded
  sample of the document's Q/A pairs;
* :mod:`.scores` - exact match and token-F1 of an answer against the
  reference, perplexity from a loss;
* :mod:`.inference` - what needs the model: the val loss (token-weighted mean
  NLL), a probe's greedy answer and its reference's teacher-forced NLL,
  with the random state kept as it was;
* :mod:`.results` - what an evaluation is, as ``--json`` prints it and
  store.db records it.

It sits low in the layers (it imports the document and the store only), so
the training pipeline, ``dlm eval`` (``dlmstore.train.evaluate``) and the
corpus (which marks validation rows duplicating training rows) all use the
same split.
"""
