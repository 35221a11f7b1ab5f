"""The Modelfile dlm export writes, read by a port of Ollama's own parser (tests/ollama_modelfile.py).

Every value (the system prompt, the template, each PARAMETER) must come
back from Ollama's reading byte for byte, or the export is refused with
one line naming the field: never a Modelfile that makes the Ollama model
run with another system prompt than the one trained and evaluated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmstore.cli.main import cli
from dlmstore.errors import ExportError
from dlmstore.export.modelfile import ModelfileSettings, comment, modelfile_text, quote

from .helpers import EXPORT_BODY, EXPORT_FRONT, VALID_ID, write_doc
from .ollama_modelfile import ParseError, create_request

#: One system prompt per character class, each of which must come back verbatim.
CARRIED = {
    "plain words": "You answer briefly.",
    "double quotes inside": 'He said "hi"',
    "a double quote first": '"Quoted" words come first',
    "a double quote last": 'Say "bye"',
    "only a double quote": '"',
    "two double quotes": '""',
    "quotes at both ends": '"both ends"',
    "a backslash": "C:\\Users\\me and a \\n that is not a newline",
    "a single quote": "It's the user's",
    "a hash": "# not a comment",
    "braces": "{{ .System }} is not a template here }}",
    "a newline": "Line one.\nLine two.",
    "a newline and quotes": 'Say "hi".\nThen "bye".',
    "a CRLF": "Line one.\r\nLine two.",
    "a lone CR": "Line one.\rLine two.",
    "a newline first": "\nAfter a blank line.",
    "a newline last": "Before a newline.\n",
    "blank lines": "One.\n\n\nFour.",
    "a tab inside": "Name:\tvalue",
    "a tab first": "\tIndented.",
    "a tab last": "Trailing tab.\t",
    "a space first": " Leading space.",
    "a space last": "Trailing space. ",
    "spaces at both ends and a quote": '  "padded"  ',
    "only spaces": "   ",
    "a triple-quote-free run of quotes": 'a "" b ""',
    "accents": "Réponds en français, s'il te plaît.",
    "CJK": "简短地回答。",
    "right to left": "أجب باختصار",
    "combining marks": "e\u0301 a\u0308",
    "emoji": "Answer with one emoji: 🙂🚀",
    "emoji with a variation selector": "\u2764\ufe0f",
    "astral punctuation and symbols": "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑ ∫ → ©",
    "the replacement character": "\ufffd",
    "a triple quote on one line": 'Say """this""" please',
    "a triple quote where quotes are needed": ' """padded""" ',
    "a triple quote inside a line of many": 'one """ two\nthree',
}

LINE_ENDS = 'holds a line that ends with \'"""\''
#: System prompts Ollama cannot carry, each refused naming what it holds.
REFUSED = {
    "a line ending in a triple quote": ('x"""\ny', LINE_ENDS),
    "a triple quote before a CRLF": ('Say """\r\nnext', LINE_ENDS),
    "a triple quote and spaces before a newline": ('"""  \n', LINE_ENDS),
    "NUL": ("a\x00b", "holds U+0000 at character 2"),
    "an escape character": ("a\x1b[31mred", "holds U+001B at character 2"),
    "a vertical tab": ("a\vb", "holds U+000B at character 2"),
    "a form feed": ("a\fb", "holds U+000C at character 2"),
    "DEL": ("a\x7fb", "holds U+007F at character 2"),
    "NEL": ("a\x85b", "holds U+0085 at character 2"),
    "a no-break space": ("a\xa0b", "holds U+00A0 (NO-BREAK SPACE) at character 2"),
    "a zero width joiner": ("👩\u200d💻", "holds U+200D (ZERO WIDTH JOINER) at character 2"),
    "a byte order mark": ("\ufeffhello", "holds U+FEFF (ZERO WIDTH NO-BREAK SPACE) at character 1"),
    "a line separator": ("a\u2028b", "holds U+2028 (LINE SEPARATOR) at character 2"),
    "an ideographic space": ("a\u3000b", "holds U+3000 (IDEOGRAPHIC SPACE) at character 2"),
    "a soft hyphen": ("co\xadoperate", "holds U+00AD (SOFT HYPHEN) at character 3"),
    "a private-use character": ("a\ue000", "holds U+E000 at character 2"),
    "a lone surrogate": ("a\udc80", "holds U+DC80 at character 2"),
}

TEMPLATE = '{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}{{ range .Messages }}{{ if eq .Role "user" }}x{{ end }}{{ end }}'


def _settings(system: str | None, stops: list[str] | None = None, header: list[str] | None = None) -> Any:
    return ModelfileSettings(
        gguf="model.Q4_K_M.gguf",
        header=header if header is not None else ["Written by a test."],
        stops=stops if stops is not None else ["<|im_end|>", "<|im_start|>"],
        temperature=0.7,
        top_p=0.9,
        num_ctx=2048,
        system=system,
    )


def _read_back(system: str) -> str | None:
    text = modelfile_text(TEMPLATE, _settings(system), where="doc.dlm")
    return create_request(text.encode("utf-8")).system


def _any_form_carries(value: str) -> bool:
    """Whether any way of writing ``value`` (bare, "…", \"\"\"…\"\"\") reads back as ``value`` in Ollama."""
    for form in (value, f'"{value}"', f'"""{value}"""'):
        try:
            data = f"FROM ./m.gguf\nSYSTEM {form}\n".encode("utf-8", "surrogatepass")
            if create_request(data).system == value:
                return True
        except ParseError:
            continue
    return False


@pytest.mark.parametrize("name", sorted(CARRIED))
def test_ollamas_parser_reads_back_the_system_prompt_byte_for_byte(name: str) -> None:
    assert _read_back(CARRIED[name]) == CARRIED[name]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_system_prompt_ollama_cannot_carry_is_one_error_naming_what_it_holds(name: str) -> None:
    system, holds = REFUSED[name]
    with pytest.raises(ExportError) as caught:
        modelfile_text(TEMPLATE, _settings(system), where="doc.dlm")
    assert caught.value.message.startswith(
        f"doc.dlm: system_prompt {holds}, which an Ollama Modelfile cannot carry"
    )
    assert caught.value.hint == (
        "change system_prompt, or export for llama-server (--target llama-server), "
        "which takes the model's own chat template"
    )
    assert not _any_form_carries(system)  # the refusal is needed: no way of writing it survives


def test_the_reproducer_is_written_as_ollamas_quote_writes_it() -> None:
    text = modelfile_text(TEMPLATE, _settings('He said "hi"'), where="doc.dlm")
    assert text.endswith('\nSYSTEM He said "hi"\n')  # bare, as `ollama show --modelfile` writes it
    multiline = modelfile_text(TEMPLATE, _settings('He said "hi"\nand left'), where="doc.dlm")
    assert multiline.endswith('\nSYSTEM """He said "hi"\nand left"""\n')
    padded = modelfile_text(TEMPLATE, _settings(" padded "), where="doc.dlm")
    assert padded.endswith('\nSYSTEM " padded "\n')


def test_no_system_prompt_and_an_empty_one_write_no_system_line() -> None:
    for system in (None, ""):
        text = modelfile_text(TEMPLATE, _settings(system), where="doc.dlm")
        assert "SYSTEM" not in text.split("TEMPLATE", 1)[0] and "\nSYSTEM " not in text
        assert create_request(text.encode()).system is None


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=40))
def test_any_system_prompt_is_read_back_exactly_or_refused_only_when_no_writing_survives(system: str) -> None:
    try:
        read = _read_back(system)
    except ExportError:
        assert not _any_form_carries(system)
        return
    assert read == (system or None)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(' "\t\n\r#\\ab{}'), max_size=24))
def test_quotes_spaces_and_line_breaks_in_any_order_are_read_back_exactly_or_refused(system: str) -> None:
    try:
        read = _read_back(system)
    except ExportError as exc:
        assert '"""' in system and '\'"""\'' in exc.message
        assert not _any_form_carries(system)
        return
    assert read == (system or None)


@pytest.mark.parametrize(
    "stop",
    ["<|im_end|>", "</s>", '"', "\n", "\n\n", " ", "User:", '"quoted"', "\\n", "a b", "\t", "\r\n"],
)
def test_every_stop_parameter_is_read_back_exactly(stop: str) -> None:
    text = modelfile_text(TEMPLATE, _settings(None, stops=[stop, "<|im_end|>"]), where="doc.dlm")
    parsed = create_request(text.encode())
    assert parsed.parameters["stop"] == [stop, "<|im_end|>"]
    assert parsed.parameters["temperature"] == ["0.7"] and parsed.parameters["num_ctx"] == ["2048"]


def test_a_stop_string_ollama_cannot_carry_is_one_error_naming_it() -> None:
    with pytest.raises(ExportError) as caught:
        modelfile_text(TEMPLATE, _settings(None, stops=["a\x00b"]), where="doc.dlm")
    assert caught.value.message == (
        "doc.dlm: the stop string 'a\\x00b' holds U+0000 at character 2, which an Ollama Modelfile cannot carry "
        "(Ollama's parser drops it)"
    )


def test_the_smollm2_template_and_its_stops_are_read_back_exactly(smollm2_tokenizer: Any) -> None:
    from dlmstore.export.targets import chat_framing, stop_strings

    framing = chat_framing(smollm2_tokenizer, where="smollm2", system='Say "hi"\n\tthen stop. ')
    stops = stop_strings(
        framing, eos=smollm2_tokenizer.eos_token, special=smollm2_tokenizer.all_special_tokens
    )
    settings_ = _settings('Say "hi"\n\tthen stop. ', stops=stops)
    parsed = create_request(modelfile_text(framing.go_template(), settings_, where="doc.dlm").encode())
    assert parsed.template == framing.go_template()
    assert parsed.parameters["stop"] == stops == ["<|im_end|>", "<|im_start|>"]
    assert parsed.system == 'Say "hi"\n\tthen stop. '
    assert parsed.model == "./model.Q4_K_M.gguf"


def test_a_template_with_a_line_ending_in_a_triple_quote_is_refused_naming_the_template() -> None:
    with pytest.raises(ExportError) as caught:
        modelfile_text('{{ .Prompt }}"""\n', _settings(None), where="doc.dlm")
    assert caught.value.message == (
        "doc.dlm: the chat template " + LINE_ENDS + ", which an Ollama Modelfile cannot carry "
        "(Ollama's parser ends the value there)"
    )


@pytest.mark.parametrize(
    "line",
    [
        "base model /models/with\nSYSTEM evil",
        "a\rFROM ./other.gguf",
        "bytes \udcff\udcfe of a path",
        "tab\there",
    ],
)
def test_a_header_line_with_a_line_break_or_odd_bytes_stays_one_comment(line: str) -> None:
    text = modelfile_text(TEMPLATE, _settings("Be brief.", header=["Written by a test.", line]), where="d")
    parsed = create_request(text.encode("utf-8"))
    assert [c.name for c in parsed.commands] == ["model", "template", "stop", "stop", "temperature", "top_p",
                                                 "num_ctx", "system"]  # fmt: skip
    assert parsed.system == "Be brief." and parsed.model == "./model.Q4_K_M.gguf"
    assert comment(line).count("\n") == 0 and comment(line).startswith("# ")


def test_quote_writes_bare_what_needs_no_quotes() -> None:
    assert quote("<|im_end|>", field="f", hint="h") == "<|im_end|>"
    assert quote("", field="f", hint="h") == ""


# --- the framing with the document's system prompt --------------------------------------------------


def test_an_empty_system_prompt_is_carried_by_the_templates_default(smollm2_tokenizer: Any) -> None:
    from dlmstore.export.targets import chat_framing

    framing = chat_framing(smollm2_tokenizer, where="smollm2", system="")
    trained = smollm2_tokenizer.apply_chat_template(
        [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert framing.render(None, [("user", "Hi")]) == trained  # Ollama, no SYSTEM line: the empty block
    assert "{{ else }}<|im_start|>system\n<|im_end|>\n{{ end }}" in framing.go_template()


def test_a_template_that_trims_the_system_prompt_is_refused(smollm2_tokenizer: Any) -> None:
    from dlmstore.export.targets import chat_framing

    tokenizer = smollm2_tokenizer
    tokenizer.chat_template = tokenizer.chat_template.replace(
        "message['content'] +", "(message['content'] | trim) +"
    )
    chat_framing(tokenizer, where="tok", system="No padding.")  # nothing to trim: carried
    with pytest.raises(ExportError) as caught:
        chat_framing(tokenizer, where="tok", system=" Padded. ")
    assert caught.value.message == (
        "tok: the chat template renders system_prompt differently from how an Ollama TEMPLATE passes it on "
        "(it changes the text, or its default when it is empty)"
    )


# --- a real export -------------------------------------------------------------------------------


@pytest.fixture
def trained(tmp_path: Path, tiny_base: Path, trained_store: Path, dlm_home: Path) -> Any:
    """Write the trained document (its store copied into this test's home) with a given system_prompt."""
    import shutil

    shutil.copytree(trained_store, dlm_home / "store" / VALID_ID)

    def write(system: str) -> Path:
        front = EXPORT_FRONT.replace(
            "system_prompt: You answer briefly.\n",
            f"system_prompt: {json.dumps(system, ensure_ascii=False)}\n",
        )
        return write_doc(
            tmp_path / "doc.dlm", body=EXPORT_BODY, frontmatter=f"base_model: {tiny_base}\n" + front
        )

    return write


def test_an_exported_modelfile_gives_ollama_the_trained_system_prompt_and_template_byte_for_byte(
    trained: Any, tmp_path: Path
) -> None:
    from dlmstore.bases import load_tokenizer, resolve_base

    system = 'He said "hi" to C:\\temp\\n.\n\tThen:  "bye" '
    doc = trained(system)
    result = CliRunner().invoke(cli, ["export", str(doc), "-o", str(tmp_path / "ex"), "--json"])
    assert result.exit_code == 0, result.output
    data = (tmp_path / "ex" / "Modelfile").read_bytes()
    assert data.endswith(b'\nSYSTEM """He said "hi" to C:\\temp\\n.\n\tThen:  "bye" """\n')
    parsed = create_request(data)
    assert parsed.system == system
    assert parsed.model == "./model.Q8_0.gguf" and parsed.parameters["stop"] == ["<|im_end|>", "<|im_start|>"]
    # Ollama renders the parsed template with the parsed system prompt as training rendered the conversation
    tokenizer = load_tokenizer(resolve_base(str(tmp_path / "ex" / "hf")))
    from dlmstore.export.targets import chat_framing

    framing = chat_framing(tokenizer, where="hf", system=system)
    assert parsed.template == framing.go_template()
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
    trained_text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert framing.render(parsed.system, [("user", "Hi")]) == trained_text


def test_exporting_a_system_prompt_ollama_cannot_carry_is_one_error_before_anything_is_written(
    trained: Any, tmp_path: Path
) -> None:
    doc = trained("Pair: 👩\u200d💻")
    result = CliRunner().invoke(cli, ["export", str(doc), "-o", str(tmp_path / "ex")])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: {doc}: system_prompt holds U+200D (ZERO WIDTH JOINER) at character 8, which an Ollama "
        "Modelfile cannot carry (Ollama's parser drops it)",
        "hint: change system_prompt, or export for llama-server (--target llama-server), which takes the "
        "model's own chat template",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dlm-home", "doc.dlm"]  # no folder, no staging
    served = CliRunner().invoke(
        cli, ["export", str(doc), "-o", str(tmp_path / "srv"), "--target", "llama-server"]
    )
    assert served.exit_code == 0, served.output  # the runtime that renders the model's own template takes it


def test_a_line_break_in_a_path_stays_a_comment_of_llama_server_sh(tmp_path: Path) -> None:
    import subprocess

    from dlmstore.export.targets import server_script

    marker = tmp_path / "ran"
    header = [f"base model /models/x\ntouch {marker}", "adapter\r\u2028v0001 \udcff"]
    script = tmp_path / "llama-server.sh"
    script.write_bytes(
        server_script("model.gguf", num_ctx=64, header=header).encode("utf-8", "surrogateescape")
    )
    lines = script.read_text(encoding="utf-8", errors="surrogateescape").splitlines()
    assert lines[1] == f"# base model /models/x\\ntouch {marker}" and lines[2].startswith("# adapter\\r")
    subprocess.run(["sh", "-n", str(script)], check=True)  # it parses; and the header runs nothing:
    subprocess.run(
        ["sh", "-c", f"sed -n '1,3p' {script} > {tmp_path / 'head.sh'}; sh {tmp_path / 'head.sh'}"],
        check=True,
    )
    assert not marker.exists()
