---
dlm_id: 01M8T0GA11ERY000000000000A
dlm_version: 15
base_model: smollm2-135m
system_prompt: You turn commit subjects into one changelog line in the project's house style.
training:
  sequence_len: 512
  lora_r: 8
  learning_rate: 2e-4
  max_steps: 30
  seed: 42
---
# Changelog writer

This project keeps a changelog written for the people who use it, not for
the people who wrote the code. Each entry is one line under a heading:
Added, Changed, Fixed or Removed. A line starts with a verb in the past
tense, names what the user sees, and ends with the pull request number in
brackets. Internal refactors that change nothing a user sees get no line.

Replace the pairs below with commit subjects from your own `git log
--oneline` and the lines you would have written for them.

::instruction::
### Q !probe
feat(cli): add --json to the status command
### A
Added: `status --json` prints the status as one JSON object (#112).

### Q !probe
fix(parser): crash on an empty frontmatter block
### A
Fixed: a document whose frontmatter is empty no longer stops the parser (#118).

### Q
perf(cache): reuse tokenized rows between runs
### A
Changed: a second run reuses the tokens of unchanged rows, so it starts sooner (#121).

### Q
refactor(store): split database.py into two modules
### A
No entry: the change is internal and nothing a user sees is different.

### Q
feat!: drop support for Python 3.9
### A
Removed: Python 3.9 is no longer supported; install on 3.10 or newer (#130).

### Q
docs: explain the cache key in the README
### A
Changed: the README explains what the cache key is made of (#133).
