"""Reports for people: what a store holds and what its runs did, drawn.

* :mod:`~dlmstore.report.sparkline`: a series as one line of block
  characters (``dlm metrics``' loss column);
* :mod:`~dlmstore.report.contents`: everything ``dlm report`` shows, read
  from ``store.db`` into one dataclass (``dlm report --json``);
* :mod:`~dlmstore.report.svg`: small line and bar charts as inline SVG;
* :mod:`~dlmstore.report.page`: the report as one self-contained HTML page.

Nothing here imports torch or transformers.
"""
