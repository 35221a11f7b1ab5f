"""Mutated documents through ``dlm show``: exit 0, or ``error:`` lines only, never a traceback.

A seeded generator (the same documents every run) takes the DLM parity
documents (``tests/fixtures/dlm/docs``) and applies one to three mutations
each: byte flips, truncations, duplicated, deleted and swapped lines, a
random YAML scalar in place of a value, deep nesting, alias bombs, fence
and heading lines, huge numbers in known keys, odd unicode and control
characters, line-ending changes. Each of the :data:`DOCUMENTS` results
goes through ``dlm show`` in-process (alternately as text, ``--json`` and
``--rows``). A failure must be one ``error:`` line per problem, each
possibly followed by a ``hint:``; ``warning:`` lines may precede either
outcome. Nothing here is timed: the bounds are measured by
``bench/bench_hostile.py``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli

from .helpers import REPO

SEEDS = sorted((REPO / "tests" / "fixtures" / "dlm" / "docs").glob("*.dlm"))

#: How many mutated documents the test runs.
DOCUMENTS = 360

SCALARS = [
    "~", "null", "true", "no", "1e999", "-1", "0", "-0.0", ".nan", "-.inf", "0x" + "f" * 600, "9" * 5000,
    "0o777", "1_000", "1:30:00", "2001-02-30", "2001-12-14t21:59:43.10-99:00", "!!binary AAA=", "!!int x",
    "!!float y", "!!bool maybe", "!!set {a, b}", "!!omap [a: 1]", "!!python/object:os.system x", "!!str",
    "'unterminated", '"\\q"', "[", "{", "]", "}", "&a x", "*a", "*undefined", "|", ">-", "- -", ": :",
    "? x", "%YAML 1.1", "@x", "`x", "#", "\t", "'" + "x" * 3000 + "'", "{a: 1, a: 2}", "[a, [b, {c: d}]]",
]  # fmt: skip

LINES = [
    "::instruction::", "::preference::", "::prose::", ":: prose ::", "  ::instruction::", "::instrction::",
    "::instruction#tone::", "::instruction#::", '::image path="x.png"::', '::audio path="a" transcript="t"::',
    "```", "````python", "~~~", "### Q", "### A", "### Prompt", "### Chosen", "### Rejected", "### Q text",
    "<!-- dlm-auto-harvest: source=\"x\" -->", '<!-- dlm-auto-mined: judge_name="j" -->',
    '<!-- dlm-auto-synth: synth_teacher="t" synth_strategy="s" synth_at="x" source_section_id="zz" -->',
    "---", "...", "dlm_id: 01KPQ1FFEDGPPSMWRAS18SAZST", "dlm_version: 99", "dlm_version: 0x" + "f" * 4000,
    "training:", "  sources:", "    - path: .", "    - path: missing", "  seed: 99999999999999999999",
    "  seed: -1", "  lora_r: 1000000000000000000000000000000", "  learning_rate: 1e308", "  sequence_len: -5",
    "  cache:", "    prune_older_than_days: 99999999999", "    max_bytes: 0", "<<: *a", "x: &a {k: v}",
]  # fmt: skip

ODD = [
    "\u2028",
    "\u2029",
    "\x85",
    "\ufeff",
    "\x00",
    "\x1b[31m",
    "\u202e",
    "\r",
    "\r\n",
    "\t",
    "\x7f",
    "é",
    "🙂",
]


def _bomb(rng: random.Random) -> str:
    kind = rng.choice(["seq", "map", "merge"])
    levels = rng.randint(3, 9)
    if kind == "seq":
        parts = ["&b0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
        parts += [f"&b{i} [{', '.join([f'*b{i - 1}'] * 9)}]" for i in range(1, levels)]
        return f"system_prompt: [{', '.join(parts)}]"
    lines = ["x0: &b0 {" + ", ".join(f"k{j}: lol" for j in range(9)) + "}"]
    for i in range(1, levels):
        refs = [f"*b{i - 1}"] * 9
        body = (
            f"<<: [{', '.join(refs)}]"
            if kind == "merge"
            else ", ".join(f"k{j}: {r}" for j, r in enumerate(refs))
        )
        lines.append(f"x{i}: &b{i} {{{body}}}")
    return "\n".join(lines)


def _nesting(rng: random.Random) -> str:
    depth = rng.choice([10, 63, 64, 65, 500, 3000])
    if rng.random() < 0.5:
        return "system_prompt: " + "[" * depth + "]" * depth
    return "system_prompt:\n" + "".join(" " * (i + 1) + "- \n" for i in range(min(depth, 400)))


def _lines(text: str) -> list[str]:
    return text.split("\n")


def _in_frontmatter(lines: list[str], rng: random.Random) -> int:
    """A line index inside the frontmatter when there is one (else anywhere)."""
    closing = lines.index("---", 1) if "---" in lines[1:] else len(lines)
    return rng.randint(1, max(1, closing))


def _mutations() -> list[Callable[[str, random.Random], str]]:
    def flip(text: str, rng: random.Random) -> str:
        data = bytearray(text.encode("utf-8", "surrogatepass"))
        for _ in range(rng.randint(1, 4)):
            if data:
                data[rng.randrange(len(data))] = rng.randrange(256)
        return data.decode("utf-8", "surrogateescape")

    def truncate(text: str, rng: random.Random) -> str:
        return text[: rng.randrange(len(text) + 1)]

    def duplicate(text: str, rng: random.Random) -> str:
        lines = _lines(text)
        i = rng.randrange(len(lines))
        return "\n".join(lines[: i + 1] + lines[i:])

    def delete(text: str, rng: random.Random) -> str:
        lines = _lines(text)
        del lines[rng.randrange(len(lines))]
        return "\n".join(lines)

    def swap(text: str, rng: random.Random) -> str:
        lines = _lines(text)
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines)

    def scalar(text: str, rng: random.Random) -> str:
        lines = _lines(text)
        keyed = [i for i, line in enumerate(lines) if ":" in line and not line.startswith("::")]
        if not keyed:
            return text
        i = rng.choice(keyed)
        key = lines[i].split(":", 1)[0]
        lines[i] = f"{key}: {rng.choice(SCALARS)}"
        return "\n".join(lines)

    def insert_line(text: str, rng: random.Random) -> str:
        lines = _lines(text)
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(LINES))
        return "\n".join(lines)

    def insert_yaml(text: str, rng: random.Random) -> str:
        lines = _lines(text)
        block = rng.choice([_bomb, _nesting])(rng)
        lines.insert(_in_frontmatter(lines, rng), block)
        return "\n".join(lines)

    def odd(text: str, rng: random.Random) -> str:
        i = rng.randrange(len(text) + 1)
        return text[:i] + rng.choice(ODD) * rng.choice([1, 1, 3, 1000]) + text[i:]

    def line_endings(text: str, rng: random.Random) -> str:
        return text.replace("\n", rng.choice(["\r\n", "\r", "\n\n", "\n \n"]))

    return [flip, truncate, duplicate, delete, swap, scalar, insert_line, insert_yaml, odd, line_endings]


def _documents() -> list[tuple[str, bytes]]:
    rng = random.Random(16)
    mutations = _mutations()
    out = []
    for number in range(DOCUMENTS):
        seed = SEEDS[number % len(SEEDS)]
        text = seed.read_bytes().decode("utf-8")
        applied = []
        for mutate in rng.sample(mutations, rng.randint(1, 3)):
            text = mutate(text, rng)
            applied.append(mutate.__name__)
        out.append((f"{number:03d}-{seed.stem}-{'+'.join(applied)}", text.encode("utf-8", "surrogateescape")))
    return out


def test_the_generator_makes_the_documents_it_promises() -> None:
    documents = _documents()
    assert len(documents) == DOCUMENTS >= 300
    assert len({data for _, data in documents}) > DOCUMENTS * 0.9  # mutations change documents
    assert documents == _documents()  # seeded: the same every run


@pytest.mark.parametrize("chunk", range(4))
def test_mutated_documents_show_or_fail_with_error_lines_only(tmp_path: Path, chunk: int) -> None:
    runner = CliRunner()
    modes: list[list[str]] = [[], ["--json"], ["--rows"]]
    documents = _documents()[chunk::4]
    for index, (name, data) in enumerate(documents):
        path = tmp_path / f"{name[:60]}.dlm"
        path.write_bytes(data)
        result = runner.invoke(cli, ["show", str(path), *modes[index % 3]])
        context = f"{name}: {result.output[-2000:]}"
        assert "Traceback" not in result.output, context
        assert result.exception is None or isinstance(result.exception, SystemExit), context
        lines = result.stderr.splitlines()
        if result.exit_code == 0:
            assert all(line.startswith("warning: ") for line in lines), context
            continue
        assert result.exit_code == 1, context
        assert lines and all(line.startswith(("error: ", "hint: ", "warning: ")) for line in lines), context
        reported = [line for line in lines if not line.startswith("warning: ")]
        assert reported[0].startswith("error: "), context
        # a hint only ever follows its error, one per error at most
        assert all(
            not (a.startswith("hint: ") and b.startswith("hint: "))
            for a, b in zip(reported, reported[1:], strict=False)
        ), context
