"""Reading datasets: opening token files, sampling, packing, mixing.

:mod:`.opening` finds and maps a dataset's files; the readers serve them to
training without loading them into memory (:mod:`.mmap_dataset`,
:mod:`.pretrain_dataset`, :mod:`.sft_dataset`), with document packing
(:mod:`.packing`), rank-partitioned sampling (:mod:`.sampler`), a resumable
loader (:mod:`.loader`) and weighted mixtures (:mod:`.mixture`). Nothing here
imports the builders.
"""
