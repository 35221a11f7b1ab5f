---
dlm_id: 01M8CA8Z725JGCFA1T84KNFSRZ
dlm_version: 15
base_model: smollm2-135m
# Three questions the base model cannot answer, and the document's answers.
# `dlm train` holds the prose out for validation (seed 33 draws it), trains
# on the three pairs and asks them after training, base and adapter side by
# side; `dlm eval` asks them again. Why these settings: docs/training.md.
training:
  sequence_len: 128
  micro_batch_size: 3           # the three pairs in every step
  grad_accum: 1
  learning_rate: 2e-3           # ten times DLM's default: 30 steps must carry three facts
  lora_r: 16
  lora_alpha: 32
  max_steps: 30
  seed: 33                      # draws the prose into the val split
---
The Larkspur Point lighthouse was built in 1911 and has been kept by the
Okonkwo family ever since. Its lamp shows a green flash every nine seconds,
and its keeper's log is kept in the harbour office at Saltmere.

::instruction::
### Q !probe
Who keeps the Larkspur Point lighthouse?
### A
The Okonkwo family.

### Q !probe
What does the Larkspur Point lamp show?
### A
A green flash every nine seconds.

### Q !probe
Where is the Larkspur Point keeper's log kept?
### A
In the harbour office at Saltmere.
