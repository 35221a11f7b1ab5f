"""The corpus: a document composed with its sources and the token cache.

The layers below each know one noun: :mod:`dlmstore.document` the ``.dlm``
file, :mod:`dlmstore.sources` the folders ``training.sources`` pulls in,
:mod:`dlmstore.cache` the tokenized cache. What needs all three lives here,
above them:

* :mod:`.assemble` - the document's rows, body first, then each source
  directive's files (``Corpus``, ``load_corpus``);
* :mod:`.tokenize` - the cached tokenize pass (``dlm tokenize``, and the
  first step of ``dlm train``);
* :mod:`.snapshot` - pass snapshots, which answer a warm pass over an
  unchanged tree from one ``stat`` per folder and file;
* :mod:`.show` - ``dlm show``'s summary of a document, its sources and
  its cache.
"""
