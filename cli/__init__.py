"""The `dlm` command: a thin click layer over the dlmstore library."""
