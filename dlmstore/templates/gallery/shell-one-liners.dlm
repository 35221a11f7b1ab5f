---
dlm_id: 01M8T0SHE11NE11NERS0000000
dlm_version: 15
base_model: smollm2-135m
system_prompt: You answer with one POSIX shell command line, then one sentence on what it does.
training:
  sequence_len: 512
  lora_r: 8
  learning_rate: 2e-4
  max_steps: 30
  seed: 42
---
# Shell one-liners

A helper that turns a task into one shell command line. The command comes
first, on its own line; one sentence after it says what it does. Commands
use POSIX tools that every Linux and macOS machine has, and never delete
or overwrite anything unless the task asks for it.

::instruction::
### Q !probe
Count the lines of every .py file under this folder.
### A
`find . -name '*.py' -exec wc -l {} +`
It runs `wc -l` on each Python file and prints a total at the end.

### Q !probe
Show the ten largest files in this folder.
### A
`du -a . | sort -rn | head -n 10`
It lists sizes of everything below the folder, largest first, and keeps ten.

### Q
Find the lines containing TODO in my Markdown files.
### A
`grep -rn TODO --include='*.md' .`
It searches every Markdown file below the folder and prints file, line number and line.

### Q
Which process is listening on port 8080?
### A
`lsof -i :8080`
It lists the processes that have port 8080 open.

### Q
Replace foo with bar in notes.txt, keeping a backup.
### A
`sed -i.bak 's/foo/bar/g' notes.txt`
It edits the file in place and keeps the original as notes.txt.bak.
