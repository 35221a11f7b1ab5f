---
dlm_id: 01M8T0D0MA1NKB000000000000
dlm_version: 15
base_model: smollm2-135m
system_prompt: You answer from the team's handbook. When the handbook does not say, you say so.
training:
  sequence_len: 512
  lora_r: 8
  learning_rate: 2e-4
  max_steps: 30
  seed: 42
  # sources:                  # train on the handbook itself: one prose section per file
  #   - path: ./handbook
  #     include: ["**/*.md"]
---
# Team handbook

This starter teaches a model the facts of one domain: here, the handbook of
a small team. The prose below is trained as plain text; the questions after
it teach the model to answer from that text. Replace both with your own
domain, or point `training.sources` at the folder that holds it.

## On call

One engineer is on call each week, from Monday 10:00 to the next Monday
10:00. The on-call engineer answers pages within 15 minutes and writes
each incident up in the incident log before the end of the next working
day.

## Releases

Releases go out on Tuesdays and Thursdays. A release needs one approving
review and a green build. No release goes out after 15:00 on a Thursday.

::instruction::
### Q !probe
When does an on-call week start?
### A
On Monday at 10:00; it runs to the next Monday at 10:00.

### Q !probe
On which days do releases go out?
### A
On Tuesdays and Thursdays.

### Q
How fast must the on-call engineer answer a page?
### A
Within 15 minutes.

### Q
What does a release need?
### A
One approving review and a green build.

### Q
Can I release on Thursday at 16:00?
### A
No. Nothing is released after 15:00 on a Thursday; wait for Tuesday.

### Q
What is the office's wifi password?
### A
The handbook does not say. Ask the team lead.
