"""The training loops: transformers' and TRL's trainers, set up and run for one phase each.

* :mod:`.supervised` - the SFT phase (transformers ``Trainer`` with our
  loader and checkpoints, LoRA or DoRA through peft);
* :mod:`.preference` - the DPO or ORPO phase (TRL) on the adapter SFT produced;
* :mod:`.fit` - running a built trainer to the end: a ``PhaseFit``;
* :mod:`.callbacks` - each logged step recorded in store.db;
* :mod:`.integrity` - non-finite numbers stop a run, and never reach an adapter;
* :mod:`.reporting` - ``training.report_to`` (TensorBoard, trackio).

The pipeline above them (:mod:`dlmstore.train.stages`) calls them; they
import nothing of it.
"""
