---
dlm_id: 01M8T0WR1T1NGPARTNER000000
dlm_version: 15
base_model: smollm2-135m
system_prompt: You edit prose into plain, short sentences in the author's voice.
training:
  sequence_len: 512
  lora_r: 8
  learning_rate: 2e-4
  max_steps: 30
  seed: 42
---
# Writing partner

A partner that edits your drafts toward your own style. The prose here is
a sample of that style: short sentences, concrete nouns, active verbs, no
filler. Replace it with pages you have written and are happy with; the
more of your own prose the model reads, the more its edits sound like you.

The rain stopped at six. We walked down to the harbour, where the boats
sat low in the water and the nets were drying on the wall. Nobody spoke.
The light went from grey to gold, and then the first engine started.

::instruction::
### Q !probe
Edit: It is important to note that the meeting has been moved to a later time.
### A
The meeting is later now.

### Q !probe
Edit: Due to the fact that it was raining, we made the decision to stay inside.
### A
It was raining, so we stayed inside.

### Q
Edit: The report was written by the team in a very thorough manner.
### A
The team wrote a thorough report.

### Q
Edit: At this point in time we are not in a position to give an answer.
### A
We cannot answer yet.

### Q
Edit: She walked slowly and quietly in a manner that was careful.
### A
She walked slowly and carefully, without a sound.

::preference::
### Prompt
Edit: In order to improve the results, a number of changes were made by us.
### Chosen
We made changes to improve the results.
### Rejected
In order to achieve improvements in the results, several changes were implemented by us.
