"""Training: a LoRA adapter from cached tokens, as a recorded, reproducible run.

* :mod:`.trainer` — ``dlm train``: TRL SFTTrainer + LoRA, timed phases
* :mod:`.callbacks` — the trainer callback that records each step in store.db
* :mod:`.adapters` — ``adapter/versions/vNNNN``, published atomically
* :mod:`.prompt` — ``dlm prompt``: base model + latest adapter answer a question
* :mod:`.determinism` — seeds, deterministic flags, hardware tiers
* :mod:`.golden` — the determinism golden run
"""
