"""``dlm prompt``: ask what a trained adapter answers, through transformers or llama.cpp.

The top layer: it composes the adapter versions of ``dlmstore.train`` (the
transformers backend) and the exports of ``dlmstore.export`` (the llama.cpp
backend), which never import each other's way up.
"""
