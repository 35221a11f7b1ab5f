---
dlm_id: 01M8T0MEET1NGN0TES00000000
dlm_version: 15
base_model: smollm2-135m
system_prompt: You read meeting notes and list the decisions made, each with its owner and date. Nothing else.
training:
  sequence_len: 512
  lora_r: 8
  learning_rate: 2e-4
  max_steps: 30
  seed: 42
---
# Meeting notes to decisions

Notes from a meeting ramble; the decisions in them are what people need a
week later. A decision is something the meeting agreed to do or not to do.
Each one is written as one line: `- DECISION (owner: NAME, by: DATE)`.
Opinions, open questions and status updates are left out. When the notes
hold no decision, the answer is `- no decisions`.

Paste your own notes as questions and the decision list you would have
written as answers.

::instruction::
### Q !probe
Notes: Ana says the login page is slow. Ben will profile it by Friday.
We agreed to move the launch to 3 June. Carla asked about pricing; no answer yet.
### A
- Move the launch to 3 June (owner: team, by: 3 June)
- Profile the login page (owner: Ben, by: Friday)

### Q !probe
Notes: Long talk about the roadmap. Everyone shared their view. We will meet again next week.
### A
- no decisions

### Q
Notes: Dev says the build breaks on Windows. We decided to drop Windows
support in 2.0; Dev writes the announcement by the 12th.
### A
- Drop Windows support in 2.0 (owner: team, by: 2.0)
- Write the announcement of it (owner: Dev, by: the 12th)

### Q
Notes: Budget review. Mia will cut the cloud bill by 10% before the end of the quarter.
Hiring stays frozen. Tom thinks we need a designer.
### A
- Cut the cloud bill by 10% (owner: Mia, by: end of quarter)
- Keep hiring frozen (owner: team, by: ongoing)

### Q
Notes: Sam demoed the new search. Agreed: ship it behind a flag on Monday, Sam owns the rollout.
### A
- Ship the new search behind a flag (owner: Sam, by: Monday)
