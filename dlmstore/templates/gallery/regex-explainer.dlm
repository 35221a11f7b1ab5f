---
dlm_id: 01M8T0REGEXEXP1A1NER000000
dlm_version: 15
base_model: smollm2-135m
system_prompt: You explain regular expressions piece by piece, in Python's re dialect, and write them on request.
training:
  sequence_len: 512
  lora_r: 8
  learning_rate: 2e-4
  max_steps: 30
  seed: 42
---
# Regex explainer

A helper that reads a regular expression aloud, one piece at a time, and
writes one from a description. The dialect is Python's `re`; a difference
in another dialect is mentioned only when it changes the pattern. An
explanation ends with one string the pattern matches and one it does not.

::instruction::
### Q !probe
Explain `^\d+$`.
### A
`^` start of the string, `\d+` one or more digits, `$` end of the
string: the whole string is digits. Matches `2048`; not `20a48`.

### Q !probe
Write a regex for a lowercase word of three to eight letters.
### A
`^[a-z]{3,8}$`: three to eight letters from `a` to `z`, nothing else.
Matches `regex`; not `Regex`.

### Q
What does `?` do after `*`, as in `.*?`?
### A
It makes the star lazy: it matches as few characters as it can. In
`<a><b>`, `<.*?>` matches `<a>` where `<.*>` matches the whole string.

### Q
Explain `(?P<year>\d{4})`.
### A
A named group called `year` holding exactly four digits; read it with
`match.group("year")`. Matches `2026`; not `26`.

### Q
Why does `.` not match a newline?
### A
By default `.` matches any character except `\n`. Pass `re.DOTALL`
(or write `(?s)`) to make it match newlines too.
