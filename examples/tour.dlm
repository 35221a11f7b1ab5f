---
dlm_id: 01M7YJ087N2NEP493AF56E3CEA
dlm_version: 15
base_model: smollm2-135m
system_prompt: You answer questions about dlmstore briefly and precisely.
training:
  sequence_len: 256
  seed: 42
  max_steps: 10
  micro_batch_size: 2           # auto would pick 16 on a CPU: slower than a tour needs
  grad_accum: 1
  sources:
    # A few pages about dlmstore, one prose section per file. Kept apart
    # from docs/ so that the numbers the README quotes move only when
    # these files do (scripts/gen-sessions.py regenerates them).
    - path: tour-sources
      include: ["**/*.md"]
---
# dlmstore, in its own words

dlmstore is a local-first store for LLM training data. A `.dlm` document
holds prose, instruction pairs and preference triples; `training.sources`
pulls in whole folders of files. Every run is recorded in one SQLite
database per store.

::instruction::
### Q
Where does dlmstore keep its metadata?
### A
In one SQLite database per store, `store.db`, with token blobs as files
beside it.

### Q
What does `dlm show` print?
### A
The document's id, base model, sections by type, the rows they become,
each source directive with what it included and skipped, and the store path.

### Q
Which command creates a new document?
### A
`dlm init PATH`, which mints a fresh ULID and writes a commented example.

::preference::
### Prompt
How should a tool report a malformed document?
### Chosen
With one line naming the file, the line and what to do next.
### Rejected
With a Python traceback.

### Prompt
Where does a training run keep its numbers?
### Chosen
In store.db: `train_steps` per step, `train_step_metrics` for the rest.
### Rejected
In a log file you have to grep.

### Prompt
What does `dlm train --no-cache` change?
### Chosen
Every row is tokenized again; the adapter is byte-identical.
### Rejected
It trains a different model.
