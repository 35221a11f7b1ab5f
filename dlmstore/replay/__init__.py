"""The replay history (issue 38): what completed train runs trained on, and what a run could replay.

* :mod:`.history` — record a run's rows (in its publish transaction), read them back, the content codec
* :mod:`.candidates` — the history rows absent from the current document and not superseded, in SQL
* :mod:`.draw` — how many to replay, their weights and the seeded weighted draw (a pure function)
* :mod:`.run_plan` — what a train run replays and measures retention on, read back checked; recorded with the run
* :mod:`.show` — ``dlm replay show``
* :mod:`.prune` — ``dlm replay prune``
* :mod:`.verify` — ``dlm cache verify`` with the history's content checked

``dlm train`` draws from it (``dlmstore.train.data.replay_rows``) and records its draw with its history.
"""
