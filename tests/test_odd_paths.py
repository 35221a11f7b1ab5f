"""Odd document paths: a file name that is not UTF-8 works, and one that is not a regular file is refused.

A POSIX file name is bytes; Python hands ``bad\\xff.dlm`` around as a str
holding a surrogate, which SQLite's TEXT and a strict UTF-8 stdout refuse.
store.db records such a path as ``store.path_text`` writes it (each byte
that is not UTF-8 as ``\\xNN``), messages show it the same way, text on
stdout passes the bytes through, and ``--json`` writes JSON's ``\\udcNN``
escape, which decodes back to the same name. A document that is a FIFO,
socket or device is refused by its kind before it is opened, so a FIFO
with no writer never hangs a command.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from html import escape
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from dlmstore.cli.main import cli
from dlmstore.home import store_dir
from dlmstore.store.path_text import path_text, text_paths, utf8_alias

from .helpers import VALID_ID, ctrl_c_after, export_doc, file_hashes, write_doc

#: ``bad\xff.dlm``: the byte 0xff is never part of UTF-8.
BAD_NAME = os.fsdecode(b"bad\xff.dlm")


@pytest.fixture
def bad_doc(tmp_path: Path) -> Path:
    return write_doc(tmp_path / BAD_NAME)


def test_show_and_tokenize_work_on_a_document_whose_name_is_not_utf8(bad_doc: Path, tiny_base: Path) -> None:
    write_doc(bad_doc, frontmatter=f"base_model: {tiny_base}\n")
    runner = CliRunner()
    tokenized = runner.invoke(cli, ["tokenize", str(bad_doc)])
    assert tokenized.exit_code == 0, tokenized.output
    shown = runner.invoke(cli, ["show", str(bad_doc), "--json"])
    assert shown.exit_code == 0, shown.output
    assert "\\udcff" in shown.stdout  # JSON's escape, valid UTF-8 ...
    assert json.loads(shown.stdout)["path"] == str(bad_doc)  # ... that decodes to the very name
    assert os.fsencode(json.loads(shown.stdout)["path"]).endswith(b"/bad\xff.dlm")
    text = runner.invoke(cli, ["show", str(bad_doc)])
    assert text.exit_code == 0 and text.stdout_bytes.startswith(b"document: " + os.fsencode(bad_doc) + b"\n")
    with sqlite3.connect(store_dir(VALID_ID) / "store.db") as db:
        recorded = db.execute("SELECT dlm_path FROM runs").fetchone()[0]
    assert recorded == path_text(bad_doc) and recorded.endswith("/bad\\xff.dlm")
    assert text_paths(recorded)[0] == str(bad_doc)


def test_stores_gc_keeps_the_store_of_a_document_whose_name_is_not_utf8(
    bad_doc: Path, tiny_base: Path
) -> None:
    write_doc(bad_doc, frontmatter=f"base_model: {tiny_base}\n")
    runner = CliRunner()
    assert runner.invoke(cli, ["tokenize", str(bad_doc)]).exit_code == 0
    listed = json.loads(runner.invoke(cli, ["stores", "--json"]).stdout)["stores"]
    assert [(s["dlm_id"], s["document_state"]) for s in listed] == [(VALID_ID, "present")]
    gc = runner.invoke(cli, ["stores", "gc", "--force"])
    assert gc.exit_code == 0, gc.output
    assert store_dir(VALID_ID).is_dir()


def test_train_works_on_a_document_whose_name_is_not_utf8(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    doc = write_doc(
        tmp_path / BAD_NAME,
        body="::instruction::\n### Q\nWhat is dlm?\n### A\nA store.\n",
        frontmatter=f"base_model: {tiny_base}\ntraining:\n  sequence_len: 64\n  max_steps: 1\n"
        "  preference:\n    enabled: false\n",
    )
    result = CliRunner().invoke(cli, ["train", str(doc)])
    assert result.exit_code == 0, result.output
    report = CliRunner().invoke(cli, ["report", str(doc), "--json"])
    assert json.loads(report.stdout)["document_path"] == path_text(doc)


def test_an_error_about_a_document_whose_name_is_not_utf8_shows_the_byte_escaped(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / BAD_NAME)
    doc.write_text("---\ndlm_id: nope\n---\n")
    result = CliRunner().invoke(cli, ["show", str(doc)])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == (
        f"error: {tmp_path}/bad\\xff.dlm:2: dlm_id: must be a 26-character Crockford base32 ULID "
        "(run `dlm init` to mint one)"
    )
    assert not store_dir("nope").exists()


def test_init_writes_a_document_whose_name_is_not_utf8(tmp_path: Path) -> None:
    doc = tmp_path / BAD_NAME
    result = CliRunner().invoke(cli, ["init", str(doc), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["path"] == str(doc) and doc.is_file()


def test_migrate_works_on_a_document_whose_name_is_not_utf8(tmp_path: Path) -> None:
    doc = tmp_path / BAD_NAME
    doc.write_text(f"---\ndlm_id: {VALID_ID}\n---\nBody.\n")
    result = CliRunner().invoke(cli, ["migrate", str(doc)])
    assert result.exit_code == 0, result.output
    assert "dlm_version: 15" in doc.read_text()
    assert Path(f"{doc}.bak").read_text() == f"---\ndlm_id: {VALID_ID}\n---\nBody.\n"


def run_dlm(*args: str) -> subprocess.CompletedProcess[str]:
    """dlm in a child process (a FIFO that hangs it fails the test instead of the whole run)."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    return subprocess.run(
        [sys.executable, "-m", "dlmstore.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize("command", ["show", "report", "migrate", "tokenize", "train"])
def test_a_document_that_is_a_fifo_is_refused_without_hanging(tmp_path: Path, command: str) -> None:
    fifo = tmp_path / "doc.dlm"
    os.mkfifo(fifo)
    result = run_dlm(command, str(fifo))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: {fifo}: is a FIFO, not a regular file",
        "hint: a .dlm document is read from a regular file: save it to one",
    ]


def test_a_document_that_is_a_device_is_refused_by_its_kind(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["show", os.devnull])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == f"error: {os.devnull}: is a character device, not a regular file"


@given(st.binary(min_size=1, max_size=40).filter(lambda b: b"/" not in b and b"\0" not in b))
def test_a_recorded_path_names_the_file_it_was_made_from(name: bytes) -> None:
    path = os.fsdecode(b"/docs/" + name)
    text = path_text(path)
    text.encode("utf-8")  # valid UTF-8: SQLite's TEXT takes it
    assert path in text_paths(text)


def test_a_utf8_path_is_recorded_as_itself() -> None:
    assert path_text("/docs/naïve.dlm") == "/docs/naïve.dlm"
    assert text_paths("/docs/naïve.dlm") == ("/docs/naïve.dlm",)
    assert path_text(b"/docs/bad\xff\xfe.dlm") == "/docs/bad\\xff\\xfe.dlm"
    assert text_paths("/docs/bad\\xff.dlm") == (os.fsdecode(b"/docs/bad\xff.dlm"), "/docs/bad\\xff.dlm")


# --- export, eval, prompt and report with odd names everywhere ------------------------------------
# The document's folder and name, the home (DLM_HOME) and the -o folder each hold the odd name.

#: Odd names, and how an error line shows them: a space, a line break, a byte that is not UTF-8.
ODD_NAMES = {
    "space": ("a b", "a b"),
    "newline": ("a\nb", "a\\nb"),
    "not-utf8": (os.fsdecode(b"a\xffb"), "a\\xffb"),
}


@pytest.fixture(params=sorted(ODD_NAMES))
def odd(request: pytest.FixtureRequest) -> str:
    return ODD_NAMES[request.param][0]


def shown(path: Path) -> str:
    """``path`` as an ``error:`` line shows it."""
    text = str(path)
    for name, escaped in ODD_NAMES.values():
        text = text.replace(name, escaped)
    return text


@pytest.fixture
def odd_doc(
    tmp_path: Path, odd: str, tiny_base: Path, trained_store: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """``trained_store``'s document as ``docs <odd>/<odd>.dlm``, its store in the home ``home <odd>``."""
    home = tmp_path / f"home {odd}"
    shutil.copytree(trained_store, home / "store" / VALID_ID)
    monkeypatch.setenv("DLM_HOME", str(home))
    folder = tmp_path / f"docs {odd}"
    folder.mkdir()
    return export_doc(folder, tiny_base).rename(folder / f"{odd}.dlm")


def _db() -> sqlite3.Connection:
    return sqlite3.connect(store_dir(VALID_ID) / "store.db")


@pytest.mark.slow
def test_an_export_into_a_folder_with_an_odd_name_is_written_recorded_and_answers(
    odd_doc: Path, odd: str, tmp_path: Path
) -> None:
    out = tmp_path / f"out {odd}"
    runner = CliRunner()
    result = runner.invoke(cli, ["export", str(odd_doc), "--quant", "F16", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["folder"] == str(out)
    manifest = json.loads((out / "dlm-export.json").read_bytes().decode("utf-8"))
    assert manifest["files"] == {
        f["path"]: {"sha256": f["sha256"], "bytes": f["bytes"]} for f in printed["files"]
    }
    assert (out / "Modelfile").read_bytes().endswith(b"\nSYSTEM You answer briefly.\n")
    with _db() as db:
        assert db.execute("SELECT path FROM exports").fetchall() == [(path_text(out),)]
    answer = runner.invoke(cli, ["prompt", str(odd_doc), "hi", "--backend", "llama.cpp", "--json"])
    assert answer.exit_code == 0, answer.output
    assert json.loads(answer.stdout)["model_file"] == str(out / "model.F16.gguf")
    # Again into the same folder, for llama-server, as text: the folder is named by its bytes.
    again = runner.invoke(
        cli, ["export", str(odd_doc), "--quant", "F16", "--target", "llama-server", "-o", str(out)]
    )
    assert again.exit_code == 0, again.output
    assert b"\nfolder: " + os.fsencode(out) + b"\n" in again.stdout_bytes
    assert sorted(p.name for p in out.iterdir()) == [  # the Modelfile of the first export removed
        "adapter.gguf", "base.F16.gguf", "dlm-export.json", "hf", "llama-server.sh", "model.F16.gguf",
    ]  # fmt: skip
    assert (
        (out / "llama-server.sh")
        .read_bytes()
        .endswith(b' --model model.F16.gguf --n_ctx 64 --host 127.0.0.1 --port 8000 "$@"\n')
    )
    with _db() as db:
        assert db.execute("SELECT target, path FROM exports ORDER BY id").fetchall() == [
            ("ollama", path_text(out)),
            ("llama-server", path_text(out)),
        ]


@pytest.mark.slow
def test_eval_prompt_and_report_work_on_a_document_and_home_with_odd_names(
    odd_doc: Path, odd: str, tmp_path: Path
) -> None:
    runner = CliRunner()
    evaluated = runner.invoke(cli, ["eval", str(odd_doc), "--json"])
    assert evaluated.exit_code == 0, evaluated.output
    assert [m["model"] for m in json.loads(evaluated.stdout)["models"]] == ["v0001", "base"]
    with _db() as db:
        assert db.execute("SELECT command, status, dlm_path FROM runs WHERE command = 'eval'").fetchall() == [
            ("eval", "completed", path_text(odd_doc))
        ]
    answer = runner.invoke(cli, ["prompt", str(odd_doc), "What writes adapters?", "--json"])
    assert answer.exit_code == 0, answer.output
    assert json.loads(answer.stdout)["adapter_version"] == 1
    page = tmp_path / f"{odd}.html"
    report = runner.invoke(cli, ["report", str(odd_doc), "-o", str(page)])
    assert report.exit_code == 0, report.output
    assert report.stderr.count("\n") == 1 and report.stderr.startswith(f"wrote {shown(page)} (")
    html = page.read_bytes().decode("utf-8")  # valid UTF-8 whatever the paths
    assert escape(path_text(odd_doc)) in html and escape(path_text(store_dir(VALID_ID))) in html
    data = runner.invoke(cli, ["report", str(odd_doc), "--json"])
    assert data.exit_code == 0, data.output
    assert json.loads(data.stdout)["store_path"] == path_text(store_dir(VALID_ID))
    assert json.loads(data.stdout)["document_path"] == path_text(odd_doc)


def test_an_error_naming_a_document_and_a_folder_with_odd_names_is_one_line_each(
    odd_doc: Path, odd: str, tmp_path: Path
) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["prompt", str(odd_doc), "hi", "--backend", "llama.cpp"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: {shown(odd_doc)}: no GGUF export yet, so llama.cpp has nothing to answer with",
        f"hint: run `dlm export {shown(odd_doc)}` first",
    ]
    theirs = tmp_path / f"theirs {odd}"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine\n")
    refused = runner.invoke(cli, ["export", str(odd_doc), "-o", str(theirs)])
    assert refused.exit_code == 1
    assert refused.stderr.splitlines()[0] == (
        f"error: {shown(theirs)} is not a folder dlm export wrote (it holds files and no dlm-export.json), "
        "so nothing is written into it"
    )
    assert len(refused.stderr.splitlines()) == 2 and sorted(os.listdir(theirs)) == ["notes.txt"]


def test_a_failed_run_records_a_path_that_is_not_utf8_as_store_db_records_paths(bad_doc: Path) -> None:
    from dlmstore.errors import StoreError
    from dlmstore.store.database import open_store
    from dlmstore.store.runs import recorded_run

    with open_store(VALID_ID, create=True) as store, pytest.raises(StoreError):
        with recorded_run(store, command="eval", dlm_path=bad_doc, dlm_sha256="0" * 64):
            raise StoreError(f"cannot read {bad_doc}")
    with _db() as db:
        assert db.execute("SELECT status, error FROM runs").fetchall() == [
            ("failed", f"cannot read {path_text(bad_doc)}")
        ]


def test_a_path_that_is_not_utf8_is_handed_to_libraries_under_a_utf8_alias(tmp_path: Path) -> None:
    folder = tmp_path / os.fsdecode(b"out\xff")
    folder.mkdir()
    with utf8_alias(folder) as alias:
        os.fsencode(alias).decode("utf-8")  # UTF-8, as safetensors and llama.cpp take a path
        assert alias.name == "out\\xff" and alias.resolve() == folder.resolve()
        (alias / "model.safetensors").write_bytes(b"weights")
    assert not alias.exists() and not alias.parent.exists()
    assert (folder / "model.safetensors").read_bytes() == b"weights"
    with utf8_alias(tmp_path / "plain") as same:
        assert same == tmp_path / "plain"


# --- dlm train with odd names: the home, the document's folder and the base beside the document ----

#: Both phases on the tiny base copied beside the document (``./base``), a checkpoint every 2 steps.
TRAIN_FRONT = (
    "base_model: ./base\ntraining:\n  sequence_len: 64\n  max_steps: 4\n  checkpoint_steps: 2\n  seed: 7\n"
)
TRAIN_BODY = (
    "::instruction::\n### Q\nWhat is dlm?\n### A\nA store.\n\n"
    "::preference::\n### Prompt\nWhat is dlm?\n### Chosen\nA store.\n### Rejected\nA cat.\n"
)


def train_doc(folder: Path, name: str, tiny_base: Path) -> Path:
    """``folder/name`` training on a copy of ``tiny_base`` in ``folder/base`` (so the base's path holds the folder's)."""
    folder.mkdir()
    shutil.copytree(tiny_base, folder / "base")
    return write_doc(folder / name, body=TRAIN_BODY, frontmatter=TRAIN_FRONT)


def trained_versions(home: Path) -> dict[str, tuple[dict[str, str], dict[str, object], str]]:
    """Each adapter version in ``home``: the sha256 of its files, adapter_config.json, and the base it names.

    The files and the config leave out the base's folder, which the config
    and peft's model card (README.md) name and which differs by home.
    """
    versions: dict[str, tuple[dict[str, str], dict[str, object], str]] = {}
    for folder in sorted((home / "store" / VALID_ID / "adapter" / "versions").glob("v*")):
        files = file_hashes(folder)
        del files["README.md"], files["adapter_config.json"]
        config = json.loads((folder / "adapter_config.json").read_bytes())
        versions[folder.name] = (files, config, config.pop("base_model_name_or_path"))
    return versions


@pytest.fixture(scope="module")
def plain_versions(
    tiny_base: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[dict[str, str], dict[str, object], str]]:
    """The versions ``dlm train`` of the training document writes in a home and folder of plain names."""
    import torch

    home = tmp_path_factory.mktemp("plain-home")
    doc = train_doc(tmp_path_factory.mktemp("plain") / "docs", "doc.dlm", tiny_base)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as one_torch_thread trains the odd ones: the same bytes
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("DLM_HOME", str(home))
            result = CliRunner().invoke(cli, ["train", str(doc)])
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    return trained_versions(home)


@pytest.fixture
def odd_train_doc(tmp_path: Path, odd: str, tiny_base: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The training document as ``docs <odd>/<odd>.dlm`` (its base ``docs <odd>/base``), in the home ``home <odd>``."""
    monkeypatch.setenv("DLM_HOME", str(tmp_path / f"home {odd}"))
    return train_doc(tmp_path / f"docs {odd}", f"{odd}.dlm", tiny_base)


@pytest.mark.slow
def test_train_in_a_home_and_folder_with_odd_names_writes_the_adapters_of_a_plain_home(
    odd_train_doc: Path,
    plain_versions: dict[str, tuple[dict[str, str], dict[str, object], str]],
    one_torch_thread: None,
) -> None:
    result = CliRunner().invoke(cli, ["train", str(odd_train_doc), "--json"])
    assert result.exit_code == 0, result.output
    assert [p["phase"] for p in json.loads(result.stdout)["phases"]] == ["sft", "preference"]
    trained = trained_versions(store_dir(VALID_ID).parent.parent)
    assert sorted(trained) == ["v0001", "v0002"]
    assert {v: (files, config) for v, (files, config, _) in trained.items()} == {
        v: (files, config) for v, (files, config, _) in plain_versions.items()
    }
    assert {base for _, _, base in trained.values()} == {str(odd_train_doc.parent / "base")}
    with _db() as db:
        assert db.execute("SELECT command, status, dlm_path FROM runs").fetchall() == [
            ("train", "completed", path_text(odd_train_doc))
        ]
    verified = CliRunner().invoke(cli, ["cache", "verify", str(odd_train_doc)])
    assert verified.exit_code == 0, verified.output


@pytest.mark.slow
def test_train_stopped_after_a_checkpoint_in_a_home_with_an_odd_name_resumes_to_the_adapters_of_a_plain_home(
    odd_train_doc: Path,
    plain_versions: dict[str, tuple[dict[str, str], dict[str, object], str]],
    one_torch_thread: None,
) -> None:
    from dlmstore.train.trainer import train_document

    with pytest.raises(KeyboardInterrupt), ctrl_c_after(3):  # the checkpoint of step 2 is written
        train_document(str(odd_train_doc))
    with _db() as db:
        ((path, base),) = db.execute("SELECT path, base_model FROM checkpoints").fetchall()
    assert path == "checkpoints/run1/checkpoint-2"
    assert base.startswith(path_text(odd_train_doc.parent / "base") + "@")  # as store.db records a path
    resumed = CliRunner().invoke(cli, ["train", str(odd_train_doc), "--resume", "--json"])
    assert resumed.exit_code == 0, resumed.output
    summary = json.loads(resumed.stdout)
    assert (summary["resumed_from"], summary["resumed_at_step"]) == (1, 2)
    trained = trained_versions(store_dir(VALID_ID).parent.parent)
    assert {v: (files, config) for v, (files, config, _) in trained.items()} == {
        v: (files, config) for v, (files, config, _) in plain_versions.items()
    }


@pytest.mark.slow
def test_a_built_in_base_is_converted_into_and_loaded_from_a_home_whose_name_is_not_utf8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / os.fsdecode(b"home\xff")  # no bases/ of the session's: this home converts its own
    monkeypatch.setenv("DLM_HOME", str(home))
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="base_model: smollm2-135m\n")
    for _ in range(2):  # converted, then loaded from the converted folder
        result = CliRunner().invoke(cli, ["tokenize", str(doc), "--json"])
        assert result.exit_code == 0, result.output
    assert (home / "bases" / "smollm2-135m" / "tokenizer" / "tokenizer.json").is_file()
