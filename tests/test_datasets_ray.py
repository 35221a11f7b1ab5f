"""`--engine ray`: the same bytes as the local engine, a killed worker, a resumed build, the CLI.

One local Ray (two CPUs, no dashboard) serves the whole module; builds use
blocks of a few documents so even tiny corpora make many tasks whose
blocks straddle shard boundaries.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.datasets.build.encoding import TextEncoder
from dlmstore.datasets.build.local import LocatedInput
from dlmstore.datasets.build.pretrain import build_pretrain_cache
from dlmstore.datasets.build.ray_build import RayEngine
from dlmstore.datasets.build.sft import build_sft_cache
from dlmstore.errors import DatasetError

from .helpers import file_hashes
from .s3_server import S3Bucket

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a Ray build starts worker processes: seconds each

TEXTS = [f"Document {i}: " + "lorem ipsum dolor " * (i % 9) for i in range(150)]
TEXTS[17] = TEXTS[40] = ""  # empty documents take a position (and a draw) too
TEXTS[3] = "Document 3: quoting <|im_end|> is text, not a special token"
CHATS: list[Any] = [
    [{"role": "user", "content": f"What is {i} + {i}?"}, {"role": "assistant", "content": f"{2 * i}."}]
    for i in range(40)
]
CHATS[5] = []
CHATS[9] = [{"role": "user", "content": "no answer"}]


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as env:
        # Workers start with the tokenizer's threads on, as a cluster's may: the build turns them off.
        env.setenv("TOKENIZERS_PARALLELISM", "true")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


class ScriptedEncoder(TextEncoder):
    """A tokenizer whose workers log what they encode, die or fail on a document saying POISON.

    ``kill_once``: the first worker to meet POISON kills its own process
    (SIGKILL, as an OOM killer would); the marker file makes the retry live.
    ``fail_while``: encoding POISON raises while that file exists.
    """

    def __init__(
        self, tokenizer: Any, log: Path, kill_once: Path | None = None, fail_while: Path | None = None
    ):
        super().__init__(tokenizer)
        self.log, self.kill_once, self.fail_while = log, kill_once, fail_while

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        if any("POISON" in t for t in texts):
            if self.kill_once is not None and not self.kill_once.exists():
                self.kill_once.touch()
                os.kill(os.getpid(), signal.SIGKILL)
            if self.fail_while is not None and self.fail_while.exists():
                raise DatasetError("poisoned document")
        with open(self.log, "a") as log:
            log.writelines(t.split(":")[0] + "\n" for t in texts)
        return super().encode_texts(texts)


class ThreadsEncoder(TextEncoder):
    """Logs ``RAYON_NUM_THREADS`` and ``TOKENIZERS_PARALLELISM`` as each tokenizing task sees them."""

    def __init__(self, tokenizer: Any, log: Path):
        super().__init__(tokenizer)
        self.log = log

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        with open(self.log, "a") as log:
            threads = [
                os.environ.get(name, "(unset)") for name in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")
            ]
            log.write(" ".join(threads) + "\n")
        return super().encode_texts(texts)


def scripted(tokenizer: Any, tmp_path: Path, **kwargs: Any) -> ScriptedEncoder:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return ScriptedEncoder(tokenizer, tmp_path / "encoded.log", **kwargs)


def pretrain(
    out: Path, enc: Any, engine: RayEngine | None, texts: list[str] = TEXTS, **kwargs: Any
) -> dict[str, str]:
    options: dict[str, Any] = {"val_frac": 0.2, "train_tokens": 900, "val_tokens": 200, "shard_bytes": 256}
    options.update(kwargs)
    build_pretrain_cache(iter(texts), out, tokenizer=enc, seed=5, name="corpus", engine=engine, **options)
    return file_hashes(out)


def test_a_ray_build_is_byte_identical_to_the_local_build_with_one_or_two_workers(
    tmp_path: Path, encoder: Any
) -> None:
    local = pretrain(tmp_path / "local", encoder, None, batch_docs=16)
    one = pretrain(tmp_path / "one", encoder, RayEngine(workers=1, block_docs=7))
    seen: list[Any] = []
    two = pretrain(tmp_path / "two", encoder, RayEngine(workers=2, block_docs=5), progress=seen.append)
    assert one == local and two == local
    meta = json.loads((tmp_path / "two" / "meta.json").read_text())
    totals = meta["totals"]
    assert totals["over_budget_docs"] > 0 and totals["skipped_empty_docs"] == 2
    read = sum(totals[k] for k in ("train_docs", "val_docs", "over_budget_docs", "skipped_empty_docs"))
    assert (seen[-1].docs, seen[-1].tokens) == (read, totals["train_tokens"] + totals["val_tokens"])
    assert [p.docs for p in seen] == sorted(p.docs for p in seen)  # counted across workers as blocks finish
    assert meta["draw_rule"].startswith("dlm-draw/1:") and not (tmp_path / "two" / ".build").exists()


def test_a_sources_own_splits_build_the_same_on_ray(tmp_path: Path, encoder: Any) -> None:
    val = [f"Held out {i}: sed ut perspiciatis" for i in range(12)]

    def build(name: str, engine: RayEngine | None) -> dict[str, str]:
        build_pretrain_cache(
            iter(TEXTS), tmp_path / name, tokenizer=encoder, val_texts=iter(val), train_tokens=700,
            shard_bytes=128, name="own", engine=engine,
        )  # fmt: skip
        return file_hashes(tmp_path / name)

    assert build("ray", RayEngine(block_docs=6)) == build("local", None)


def test_an_sft_build_on_ray_is_byte_identical_to_the_local_build(tmp_path: Path, encoder: Any) -> None:
    def build(name: str, engine: RayEngine | None) -> dict[str, str]:
        build_sft_cache(
            iter(CHATS), tmp_path / name, tokenizer=encoder, val_frac=0.3, seed=2, name="chats", engine=engine
        )
        return file_hashes(tmp_path / name)

    assert build("ray", RayEngine(workers=2, block_docs=6)) == build("local", None)


def test_a_malformed_example_fails_on_ray_with_the_local_engines_message(
    tmp_path: Path, encoder: Any
) -> None:
    examples = [*CHATS[:20], [{"role": "wizard", "content": "abracadabra"}], *CHATS[20:]]
    messages = []
    for name, engine in (("local", None), ("ray", RayEngine(block_docs=6))):
        with pytest.raises(DatasetError) as info:
            build_sft_cache(iter(examples), tmp_path / name, tokenizer=encoder, engine=engine)
        messages.append(info.value.message)
    assert messages[0] == messages[1] and messages[0].startswith("example 20")


def test_build_all_on_ray_builds_the_same_sources_as_locally(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(6):
        (notes / f"note{i}.md").write_text(f"# Note {i}\n\n" + "Something worth remembering. " * (i + 1))
    dolly = tmp_path / "dolly.jsonl"
    dolly.write_text(
        "".join(
            json.dumps({"instruction": f"Count to {i}.", "context": "", "response": f"{i}."}) + "\n"
            for i in range(15)
        )
    )
    runner = CliRunner()
    hashes = []
    for name, engine in (("local", []), ("ray", ["--engine", "ray"])):
        args = [
            "--local",
            f"roam={notes}",
            "--local",
            f"dolly-15k={dolly}",
            "--only",
            "roam",
            "--only",
            "dolly-15k",
        ]
        result = runner.invoke(
            cli, ["data", "build-all", "--cache-dir", str(tmp_path / name), *args, *engine]
        )
        assert result.exit_code == 0, result.output
        hashes.append(
            {k: v for k, v in file_hashes(tmp_path / name).items() if k.startswith(("pretrain/", "sft/"))}
        )
    assert hashes[0] == hashes[1] and "sft/dolly15k/train_tokens.bin" in hashes[0]


def test_each_tokenizing_task_uses_one_tokenizer_thread_whatever_its_workers_environment(
    tmp_path: Path, tokenizer: Any
) -> None:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    enc = ThreadsEncoder(tokenizer, tmp_path / "threads.log")
    pretrain(tmp_path / "ray", enc, RayEngine(workers=2, block_docs=10))
    seen = (tmp_path / "threads.log").read_text().splitlines()
    assert len(seen) > 2 and set(seen) == {"1 true"}  # Ray runs one task per CPU: a pool of one thread


def test_a_worker_killed_mid_build_is_retried_and_the_output_is_unchanged(
    tmp_path: Path, tokenizer: Any, encoder: Any
) -> None:
    texts = [*TEXTS[:12], "Document POISON: killed once", *TEXTS[12:]]
    enc = scripted(tokenizer, tmp_path, kill_once=tmp_path / "killed")
    built = pretrain(tmp_path / "ray", enc, RayEngine(workers=2, block_docs=8), texts)
    assert (tmp_path / "killed").exists()  # a worker did die
    assert built == pretrain(tmp_path / "local", encoder, None, texts)


def test_an_interrupted_build_registers_nothing_and_a_rerun_reuses_the_finished_blocks(
    tmp_path: Path, tokenizer: Any, encoder: Any
) -> None:
    texts = [*TEXTS[:80], "Document POISON: fails the first run", *TEXTS[80:]]
    (tmp_path / "failing").touch()
    enc = scripted(tokenizer, tmp_path, fail_while=tmp_path / "failing")
    engine = RayEngine(workers=2, block_docs=10)
    options: dict[str, Any] = {"train_tokens": None, "val_tokens": None}
    with pytest.raises(DatasetError, match="poisoned document"):
        pretrain(tmp_path / "ray", enc, engine, texts, **options)
    assert not (tmp_path / "ray" / "meta.json").exists()
    first_run = (tmp_path / "encoded.log").read_text().splitlines()
    before = {t.split(":")[0] for t in texts[:80] if t}  # the blocks before the poisoned one
    assert before <= set(first_run)
    (tmp_path / "failing").unlink()
    (tmp_path / "encoded.log").unlink()
    built = pretrain(tmp_path / "ray", enc, engine, texts, **options)
    rerun = (tmp_path / "encoded.log").read_text().splitlines()
    assert not before & set(rerun)  # not tokenized again
    assert "Document POISON" in rerun
    assert built == pretrain(tmp_path / "local", encoder, None, texts, **options)


def test_the_cli_builds_on_ray_and_registers_once_every_file_is_written(tmp_path: Path) -> None:
    good = tmp_path / "docs.jsonl"
    good.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:60]))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + '{"body": "no text"}\n')
    runner = CliRunner()
    store = tmp_path / "store"

    def build(source: Path, out: str, *engine: str) -> Any:
        args = ["--from", str(source), "--out", str(tmp_path / out / "corpus"), "--store", str(store)]
        return runner.invoke(
            cli, ["data", "build", "pretrain", *args, "--shard-bytes", "256", "--json", *engine]
        )

    local = build(good, "local")
    assert local.exit_code == 0, local.output
    failed = build(bad, "ray", "--engine", "ray", "--workers", "2")
    assert failed.exit_code == 1 and "has no string field 'text'" in failed.output
    assert not (tmp_path / "ray" / "corpus" / "meta.json").exists()

    def registered() -> list[str]:
        with sqlite3.connect(store / "store.db") as db:
            return [row[0] for row in db.execute("select path from datasets order by id")]

    assert registered() == [str(tmp_path / "local" / "corpus")]
    built = build(good, "ray", "--engine", "ray", "--workers", "2")
    assert built.exit_code == 0, built.output
    assert registered() == [str(tmp_path / "local" / "corpus"), str(tmp_path / "ray" / "corpus")]
    shown = [json.loads(r.output)["build"] for r in (built, local)]
    for result in shown:
        result.pop("path"), result.pop("seconds")
    moved = shown[0].pop("driver_bytes")
    assert shown[1].pop("driver_bytes") is None  # the local engine: no driver
    assert (moved["reader"], moved["read"]) == ("workers", 0)  # the driver read none of the input
    assert shown[0] == shown[1]
    assert file_hashes(tmp_path / "ray") == file_hashes(tmp_path / "local")


# --- the workers read their own input: the driver plans and commits only ------------------------


def jsonl(path: Path, records: list[Any], endings: tuple[str, ...] = ("\n",)) -> Path:
    path.write_bytes(
        "".join(
            json.dumps(r, ensure_ascii=False) + endings[i % len(endings)] for i, r in enumerate(records)
        ).encode()
    )
    return path


def corpus(folder: Path, texts: list[str] = TEXTS) -> Path:
    """TEXTS as files a worker reads by range: JSONL with every line ending, then Parquet in row groups of 7."""
    folder.mkdir()
    jsonl(folder / "a.jsonl", [{"text": t} for t in texts[:100]], ("\n", "\r\n", "\r"))
    pq.write_table(pa.table({"text": texts[100:]}), folder / "b.parquet", row_group_size=7)
    return folder


def test_workers_reading_their_own_ranges_build_the_bytes_of_the_local_engine(
    tmp_path: Path, encoder: Any
) -> None:
    source = corpus(tmp_path / "in")
    options: dict[str, Any] = {"val_frac": 0.2, "train_tokens": 900, "val_tokens": 200, "shard_bytes": 256}
    built = {}
    for name, engine in (
        ("local", None),
        ("one", RayEngine(workers=1, range_bytes=300, block_docs=10)),
        ("two", RayEngine(workers=2, range_bytes=77, block_docs=3)),
    ):
        result = build_pretrain_cache(
            LocatedInput(str(source)), tmp_path / name, tokenizer=encoder, seed=5, name="corpus", engine=engine,
            **options,
        )  # fmt: skip
        built[name] = (file_hashes(tmp_path / name), result.driver_bytes)
    assert built["one"][0] == built["local"][0] and built["two"][0] == built["local"][0]
    assert built["local"][1] is None
    moved = built["two"][1]
    assert moved is not None and (moved.reader, moved.read) == ("workers", 0)
    assert moved.input == sum(f.stat().st_size for f in source.iterdir())


def test_an_sft_build_whose_workers_read_the_records_is_byte_identical_to_the_local_build(
    tmp_path: Path, encoder: Any
) -> None:
    records: list[Any] = [{"messages": chat} for chat in CHATS]
    records[12] = {"instruction": "Count to 3.", "context": "", "response": "1, 2, 3."}  # dolly-style
    source = jsonl(tmp_path / "chats.jsonl", records, ("\n", "\r\n"))

    def build(name: str, engine: RayEngine | None) -> dict[str, str]:
        build_sft_cache(
            LocatedInput(str(source), text_field=None), tmp_path / name, tokenizer=encoder, val_frac=0.3, seed=2,
            name="chats", engine=engine,
        )  # fmt: skip
        return file_hashes(tmp_path / name)

    assert build("ray", RayEngine(workers=2, range_bytes=200)) == build("local", None)


def test_a_ray_build_of_a_few_megabytes_moves_at_most_one_percent_of_its_input_through_the_driver(
    tmp_path: Path, encoder: Any
) -> None:
    words = "the beds are watered at dawn and the compost is turned every week".split()
    texts = [" ".join(words[(i + j) % len(words)] for j in range(300)) + f" ({i})" for i in range(1500)]
    source = jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in texts])
    assert source.stat().st_size > 2_000_000
    by_workers = build_pretrain_cache(
        LocatedInput(str(source)), tmp_path / "ray", tokenizer=encoder, val_frac=0.1, name="web",
        engine=RayEngine(workers=2, range_bytes=256 << 10),
    ).driver_bytes  # fmt: skip
    assert by_workers is not None and by_workers.read == 0
    per_input = by_workers.read + by_workers.sent + by_workers.received - by_workers.tokenizer
    assert per_input <= 0.01 * by_workers.input  # descriptors out, 2 bytes a document back
    assert (
        0 < by_workers.tokenizer < len(pickle.dumps(encoder.for_data(), protocol=5)) / 2
    )  # once, compressed
    by_driver = build_pretrain_cache(
        iter(texts), tmp_path / "driver", tokenizer=encoder, val_frac=0.1, name="web", engine=RayEngine(workers=2),
    ).driver_bytes  # fmt: skip
    assert by_driver is not None and by_driver.reader == "driver"
    assert by_driver.sent - by_driver.tokenizer > by_driver.input  # every document's text went through it
    assert file_hashes(tmp_path / "ray") == file_hashes(tmp_path / "driver")


def test_a_build_by_range_stopped_by_a_failure_reuses_its_finished_ranges_when_run_again(
    tmp_path: Path, tokenizer: Any, encoder: Any
) -> None:
    texts = [*TEXTS[:80], "Document POISON: fails the first run", *TEXTS[80:]]
    source = jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in texts])
    (tmp_path / "failing").touch()
    enc = scripted(tokenizer, tmp_path, fail_while=tmp_path / "failing")
    engine = RayEngine(workers=2, range_bytes=400)

    def build(out: Path, encoder: Any, engine: RayEngine | None) -> dict[str, str]:
        build_pretrain_cache(
            LocatedInput(str(source)), out, tokenizer=encoder, val_frac=0.2, name="web", engine=engine
        )
        return file_hashes(out)

    with pytest.raises(DatasetError, match="poisoned document"):
        build(tmp_path / "ray", enc, engine)
    assert not (tmp_path / "ray" / "meta.json").exists()
    before = {t.split(":")[0] for t in texts[:60] if t}  # ranges well before the poisoned one
    assert before <= set((tmp_path / "encoded.log").read_text().splitlines())
    (tmp_path / "failing").unlink()
    (tmp_path / "encoded.log").unlink()
    built = build(tmp_path / "ray", enc, engine)
    rerun = (tmp_path / "encoded.log").read_text().splitlines()
    assert not before & set(rerun) and "Document POISON" in rerun  # only the rest was tokenized
    assert built == build(tmp_path / "local", encoder, None)


def test_a_ray_build_from_a_bucket_reads_it_by_range_into_the_bytes_of_a_local_build_of_a_copy(
    tmp_path: Path, s3: S3Bucket, tiny_base: Path
) -> None:
    source = corpus(tmp_path / "in")
    for file in sorted(source.iterdir()):
        s3.put(f"corpus/{file.name}", file.read_bytes())
    common = ["--base", str(tiny_base), "--shard-bytes", "256", "--name", "web", "--json"]

    def build(source: str, out: str, *engine: str) -> Any:
        args = ["data", "build", "pretrain", "--from", source, "--out", str(tmp_path / out), *common, *engine]
        if not engine:  # the local engine, in this process
            return json.loads(CliRunner().invoke(cli, args, catch_exceptions=False).stdout)
        # A local Ray of its own, started by the command: its workers inherit the S3 environment.
        done = subprocess.run(
            [sys.executable, "-m", "dlmstore.cli.main", *args], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    copy = build(str(source), "copy")
    on_ray = build(s3.url("corpus"), "ray", "--engine", "ray", "--workers", "2")
    build(s3.url("corpus"), "local")
    assert dataset_files(tmp_path / "ray") == dataset_files(tmp_path / "local")  # meta.json too
    hashes = [dataset_files(tmp_path / name) for name in ("ray", "copy")]
    assert hashes[0].pop("meta.json") != hashes[1].pop("meta.json")  # it records where the input was
    assert hashes[0] == hashes[1] and "train/shard_00000.bin" in hashes[0]
    meta = json.loads((tmp_path / "ray" / "meta.json").read_text())
    assert meta["source"] == {"type": "s3", "url": s3.url("corpus")}
    moved = on_ray["build"]["driver_bytes"]
    assert (moved["reader"], moved["read"], moved["input"]) == ("workers", 0, copy_size(source))
    assert copy["build"]["splits"] == on_ray["build"]["splits"]


def dataset_files(folder: Path) -> dict[str, str]:
    """The hashes of a dataset's own files (not the store.db registered beside them)."""
    return {
        k: v for k, v in file_hashes(folder).items() if k == "meta.json" or k.startswith(("train/", "val/"))
    }


def copy_size(folder: Path) -> int:
    return sum(file.stat().st_size for file in folder.iterdir())
