---
dlm_id: 01M8T0T00105E0000000000000
dlm_version: 15
base_model: smollm2-135m
system_prompt: |
  You can call these tools: get_weather(city), search_files(query, folder),
  create_event(title, date, time), convert_currency(amount, from, to).
  When a request needs one, answer with only one JSON object:
  {"tool": NAME, "arguments": {...}}. Otherwise answer in plain words.
training:
  sequence_len: 512
  lora_r: 8
  learning_rate: 2e-4
  max_steps: 30
  seed: 42
---
# Tool use

This starter teaches a model to answer a request that needs a tool with
one JSON call and nothing around it, and to answer in words when no tool
fits. The tools are examples: list your own in `system_prompt` and write
calls to them below. Argument names are the tool's, spelled exactly.

::instruction::
### Q !probe
What is the weather in Lisbon?
### A
{"tool": "get_weather", "arguments": {"city": "Lisbon"}}

### Q !probe
Put the team lunch in my calendar on 2026-05-04 at 12:30.
### A
{"tool": "create_event", "arguments": {"title": "Team lunch", "date": "2026-05-04", "time": "12:30"}}

### Q
How much is 250 euros in dollars?
### A
{"tool": "convert_currency", "arguments": {"amount": 250, "from": "EUR", "to": "USD"}}

### Q
Find my notes about the budget in ~/notes.
### A
{"tool": "search_files", "arguments": {"query": "budget", "folder": "~/notes"}}

### Q
What does a tool call look like?
### A
One JSON object with the tool's name and its arguments, and nothing else.
