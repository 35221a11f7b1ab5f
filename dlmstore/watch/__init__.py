"""``dlm train --watch``: retrain on each save of a document or of its sources.

:mod:`~dlmstore.watch.saves` gathers the saves (watchfiles, on background
threads) and :mod:`~dlmstore.watch.cycles` runs the loop: a capped train
run per settled burst of saves that changed the rows, one line for a save
that changed none. It sits above ``dlmstore.train``, whose runs it starts.
"""
