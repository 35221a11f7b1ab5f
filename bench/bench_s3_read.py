"""Benchmark: reading a token dataset from a bucket (a local S3 server) beside reading it from local disk.

A synthetic pretrain dataset (random uint16 tokens in shards, a meta.json
the readers accept) is written to a local folder and uploaded to moto's S3
server on 127.0.0.1 (its own process, ``moto_server``, as
``bench_s3_build.py`` starts it). Then, alternating, each repeat times:

* **local**: one epoch of ``MemoryMappedDataset`` windows (2,049 tokens,
  as ``dlm train`` reads them) over the local folder;
* **s3 first epoch**: :func:`dlmstore.objstore.node_cache.local_copy` into
  an empty node cache (download, each file hashed and verified as it
  arrives, meta.json last), then the same epoch over the copy;
* **moto alone**: every object fetched with plain boto3 GETs in 4 threads,
  the bodies dropped: the most any client gets from this server here;
* **s3 later epoch**: ``local_copy`` again (the entry is there: one GET of
  meta.json) and the same epoch.

Prints the medians and the ratios of rates (target: first epoch >= 0.7x
local, later epochs ~1x). The local folder and the cache copy were both
just written, so both epochs read from the page cache: the local rate is
the reader's, not a cold disk's.

    python bench/bench_s3_read.py [--size 256M] [--repeat 3] [--shard-bytes 64M]

``--size 2G`` is the issue's figure (several minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ray_build import parse_size
from bench_s3_build import free_port, start_server

BUCKET = "dlm-bench"
SEQ_LEN = 2049


def write_dataset(folder: Path, size: int, shard_bytes: int) -> int:
    """Random uint16 shards of ``size`` bytes in all under ``folder/train`` and a meta.json; the bytes."""
    import numpy as np

    rng = np.random.default_rng(0)
    (folder / "train").mkdir(parents=True)
    files = []
    offset, index = 0, 0
    while offset < size:
        count = min(shard_bytes, size - offset) // 2
        tokens = rng.integers(0, 49152, size=count, dtype=np.uint16)
        path = folder / "train" / f"shard_{index:05d}.bin"
        tokens.tofile(path)
        data = path.read_bytes()
        files.append({
            "split": "train", "role": "tokens", "path": f"train/shard_{index:05d}.bin", "shard_index": index,
            "token_offset": offset // 2, "token_count": count, "doc_count": 0, "bytes": len(data),
            "sha256": "sha256:" + hashlib.sha256(data).hexdigest(),
        })  # fmt: skip
        offset += 2 * count
        index += 1
    meta = {
        "format": "dlm-token-dataset/1", "kind": "pretrain", "built": True, "dataset_name": "bench",
        "dataset_config": None, "split_rule": "every document to train", "seed": 0, "token_dtype": "uint16",
        "byte_order": "little", "tokenizer_name": "bench", "tokenizer_sha256": "sha256:" + "0" * 64,
        "vocab_size": 49152, "special_token_ids": {"eos": 0}, "totals": {"train_tokens": offset // 2},
        "files": files, "streaming": False, "shard_bytes": shard_bytes, "shard_tokens": shard_bytes // 2,
        "eos_token_id": 0, "budgets": {},
    }  # fmt: skip
    (folder / "meta.json").write_text(json.dumps(meta, sort_keys=True, indent=2) + "\n")
    return offset


def epoch(folder: Path) -> float:
    """Seconds for one epoch of ``dlm train``-sized windows over ``folder/train``."""
    from dlmstore.datasets.read.mmap_dataset import MemoryMappedDataset

    start = time.perf_counter()
    windows = MemoryMappedDataset(folder / "train", SEQ_LEN, file_pattern="shard_*.bin")
    total = 0
    for index in range(len(windows)):
        total += int(windows[index]["input_ids"][0])
    return time.perf_counter() - start


def upload(client: Any, folder: Path, prefix: str) -> None:
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    for name in sorted(names, key=lambda n: n == "meta.json"):  # meta.json last
        client.upload_file(str(folder / name), BUCKET, f"{prefix}/{name}")


def bare_gets(client: Any, folder: Path, prefix: str) -> float:
    """Seconds to GET every object of the dataset in 4 threads, the bodies read and dropped: the server's rate."""
    from concurrent.futures import ThreadPoolExecutor

    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())

    def get(name: str) -> int:
        body = client.get_object(Bucket=BUCKET, Key=f"{prefix}/{name}")["Body"]
        return sum(len(block) for block in iter(lambda: body.read(1 << 18), b""))

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(get, names))
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=parse_size("256M"))
    parser.add_argument("--shard-bytes", type=parse_size, default=parse_size("64M"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import boto3
    from botocore.config import Config

    port = free_port()
    server = start_server(port)
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(
        AWS_ENDPOINT_URL_S3=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )  # fmt: skip
    from dlmstore.objstore.node_cache import local_copy, release_copies
    from dlmstore.objstore.uri import ObjectURI

    local_s: list[float] = []
    first_s: list[float] = []
    download_s: list[float] = []
    later_s: list[float] = []
    try:
        with tempfile.TemporaryDirectory(prefix="dlm-bench-s3-read-") as tmp:
            root = Path(tmp)
            size = write_dataset(root / "local", args.size, args.shard_bytes)
            client = boto3.client(
                "s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
                region_name="us-east-1", config=Config(s3={"addressing_style": "path"}),
            )  # fmt: skip
            client.create_bucket(Bucket=BUCKET)
            upload(client, root / "local", "ds")
            uri = ObjectURI.parse(f"s3://{BUCKET}/ds")
            epoch(root / "local")  # warm: the local files in the page cache, torch imported
            bare = statistics.median(bare_gets(client, root / "local", "ds") for _ in range(args.repeat))
            for run in range(args.repeat):
                cache = root / f"cache{run}"
                os.environ["DLM_OBJECT_CACHE"] = str(cache)
                for variant in ("local", "s3") if run % 2 == 0 else ("s3", "local"):
                    if variant == "local":
                        local_s.append(epoch(root / "local"))
                        continue
                    start = time.perf_counter()
                    copy = local_copy(uri)
                    download_s.append(time.perf_counter() - start)
                    if copy.downloaded_bytes < size:
                        raise SystemExit(
                            f"the first local_copy fetched {copy.downloaded_bytes} of {size} bytes"
                        )
                    first_s.append(time.perf_counter() - start + epoch(copy.path))
                    start = time.perf_counter()
                    again = local_copy(uri)
                    later_s.append(time.perf_counter() - start + epoch(again.path))
                release_copies()
                shutil.rmtree(cache)
    finally:
        server.terminate()
        server.wait(timeout=30)

    mb = size / 1e6
    local, first, later = (statistics.median(v) for v in (local_s, first_s, later_s))
    download = statistics.median(download_s)
    print(f"dataset: {mb:.0f} MB in shards of {args.shard_bytes / 1e6:.0f} MB, windows of {SEQ_LEN} tokens")
    print(
        f"local:       median {local:.2f} s  {mb / local:7.0f} MB/s  ({', '.join(f'{s:.2f}' for s in local_s)})"
    )
    print(
        f"s3 first:    median {first:.2f} s  {mb / first:7.0f} MB/s  (download + verify {download:.2f} s, "
        f"{mb / download:.0f} MB/s from moto on 127.0.0.1)"
    )
    print(
        f"moto alone:  median {bare:.2f} s  {mb / bare:7.0f} MB/s  (boto3 GETs in 4 threads, bodies dropped)"
    )
    print(f"s3 later:    median {later:.2f} s  {mb / later:7.0f} MB/s  (the cache's copy)")
    print(f"ratio first: {local / first:.2f}x the local rate (target >= 0.7)")
    print(f"ratio later: {local / later:.2f}x the local rate (target ~1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
