"""The learned gate: which named adapter a prompt should go to (DLM's ``training.gate``).

A document with two or more named adapters (``training.adapters``) may ask
for a gate: a small MLP, trained after the adapters' SFT, that maps a
prompt to one weight per adapter. The pieces, each one noun:

* :mod:`.prompts` - the prompts it trains on and their labels: each routed
  section's prompt (``::instruction#tone::`` labels its first question
  ``tone``), as DLM's orchestrator picks them;
* :mod:`.embedding` - a prompt as the base sees it: the mean of the base's
  last hidden state over the prompt's tokens, adapters off;
* :mod:`.fitting` - the MLP fitted on those embeddings (cross-entropy plus
  DLM's entropy term, seeded, on the CPU), or uniform routing below the
  cold-start floor;
* :mod:`.files` - its folder ``gate/run<N>``: ``gate.safetensors`` and
  ``gate.json``, written atomically, checked against store.db before loading;
* :mod:`.gates` - its row in store.db's ``gates`` table.

torch is imported inside the functions that run it, never at import time.
"""
