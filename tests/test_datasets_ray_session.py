"""`--engine ray` with no cluster: a local Ray of `--workers` CPUs, started for the build and stopped after.

`tests/test_datasets_ray.py` shares one Ray across its builds (as a
notebook would); here nothing runs Ray beforehand, so each build starts
its own, as `dlm data build --engine ray --workers N` does on a laptop.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dlmstore.datasets.build.ray_build import RayEngine
from dlmstore.datasets.build.recipes import build_pretrain_from

from .helpers import file_hashes

ray = pytest.importorskip("ray")


@pytest.mark.slow
def test_without_a_cluster_each_build_starts_a_local_ray_of_its_workers_and_stops_it_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not ray.is_initialized()  # the build must start its own Ray
    source = tmp_path / "docs.jsonl"
    source.write_text(
        "".join(json.dumps({"text": f"Document {i}: " + "lorem ipsum " * (i % 7)}) + "\n" for i in range(300))
    )

    def build(out: str, engine: RayEngine | None) -> tuple[dict[str, str], set[Any]]:
        cpus = set()

        def progress(_: Any) -> None:
            if engine is not None:
                cpus.add(ray.cluster_resources().get("CPU"))

        build_pretrain_from(
            source, tmp_path / out, store_dir=tmp_path / "store", name="corpus", val_frac=0.2,
            shard_bytes=512, engine=engine, progress=progress,
        )  # fmt: skip
        assert not ray.is_initialized()
        return file_hashes(tmp_path / out), cpus

    local, _ = build("local", None)
    one, one_cpus = build("one", RayEngine(workers=1, block_docs=16))
    three, three_cpus = build("three", RayEngine(workers=3, block_docs=16))  # more workers than cores
    assert (one_cpus, three_cpus) == ({1.0}, {3.0})
    assert one == local and three == local and "val/shard_00001.bin" in local
