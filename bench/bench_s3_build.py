"""Benchmark: `dlm data build --out s3://...` (a local S3 server) beside the same build with a local --out.

Runs ``dlm data build pretrain`` as a user does (a fresh process each
time, the SmolLM2 tokenizer, the local engine) on one synthetic JSONL
corpus, alternating a build into a local folder and a build into a bucket
of moto's S3 server on 127.0.0.1 (started here as its own process,
``moto_server``, so the server's CPU is not the build's interpreter's), so
a drift of the machine's speed hits both alike; every other pair runs the
s3 build first. Prints each variant's
median wall time, the median of the pairs' ratios (target: s3 within
1.2x of local), the upload's own time from ``--json`` (``uploaded.seconds``:
its share of the s3 build, the figure a loaded machine's noise moves
least, and its rate) and checks that every object equals the local build's
file of the same name.

    python bench/bench_s3_build.py [--tokens 5M] [--repeat 3] [--shard-bytes 16MiB] [--check]

``--tokens`` sets the corpus size (default 5M: about a minute on 2
cores); ``--check`` exits 1 when the median ratio misses the target.
``--engine ray --workers N`` builds both variants on a local Ray of N
workers: the s3 build's tasks then upload their own files, and the bench
prints the bytes through the driver (``build.driver_bytes``) beside the
dataset's size, which the driver's upload of a staged copy would send.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ray_build import parse_size, write_corpus
from benchlib import DLM

TARGET = 1.2
BUCKET = "dlm-bench"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_server(port: int) -> subprocess.Popen[bytes]:
    """moto's S3 server as its own process on 127.0.0.1:``port``, once it answers."""
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/data.json", timeout=2):
                return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("moto_server did not answer within 60 s")


def build(
    corpus: Path, out: str, env: dict[str, str], shard_bytes: str, engine: list[str]
) -> tuple[float, dict[str, Any]]:
    args = [DLM, "data", "build", "pretrain", "--from", str(corpus), "--out", out, "--name", "bench"]
    args += ["--shard-bytes", shard_bytes, "--json", *engine]
    start = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr}")
    return seconds, json.loads(done.stdout)


def local_hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def object_hashes(client: Any, prefix: str) -> dict[str, str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/")
    keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
    return {
        key[len(prefix) + 1 :]: hashlib.sha256(
            client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        ).hexdigest()
        for key in keys
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=parse_size, default=parse_size("5M"))
    parser.add_argument("--repeat", type=int, default=3, help="local/s3 pairs, alternated")
    parser.add_argument("--shard-bytes", default="16MiB")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--engine", choices=("local", "ray"), default="local")
    parser.add_argument("--workers", type=int, default=2, help="Ray workers (with --engine ray)")
    args = parser.parse_args()
    engine = ["--engine", "ray", "--workers", str(args.workers)] if args.engine == "ray" else []

    import boto3
    from botocore.config import Config

    port = free_port()
    server = start_server(port)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        with tempfile.TemporaryDirectory(prefix="dlm-bench-s3-") as tmp:
            root = Path(tmp)
            corpus = root / "corpus.jsonl"
            docs = write_corpus(corpus, args.tokens)
            env = {
                **os.environ,
                "DLM_HOME": str(root / "home"),
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_VERBOSITY": "error",
                "AWS_ENDPOINT_URL_S3": endpoint,
                "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench",
                "AWS_DEFAULT_REGION": "us-east-1",
            }
            client = boto3.client(
                "s3",
                endpoint_url=endpoint,
                aws_access_key_id="bench",
                aws_secret_access_key="bench",
                region_name="us-east-1",
                config=Config(s3={"addressing_style": "path"}),
            )
            client.create_bucket(Bucket=BUCKET)
            build(corpus, str(root / "warm-up"), env, args.shard_bytes, engine)  # the tokenizer, once
            local_s: list[float] = []
            s3_s: list[float] = []
            upload_s: list[float] = []
            driver: list[int] = []
            source = tokenizer = 0
            same = True
            for run in range(args.repeat):
                out = root / f"local{run}"
                # Each pair in the other order: the second build of a pair ran slower on a busy machine.
                for variant in ("local", "s3") if run % 2 == 0 else ("s3", "local"):
                    if variant == "local":
                        seconds, _ = build(corpus, str(out), env, args.shard_bytes, engine)
                        local_s.append(seconds)
                    else:
                        url = f"s3://{BUCKET}/run{run}"
                        seconds, done = build(corpus, url, env, args.shard_bytes, engine)
                        s3_s.append(seconds)
                        if done["build"].get("driver_bytes"):
                            moved = done["build"]["driver_bytes"]
                            driver.append(moved["read"] + moved["sent"] + moved["received"])
                            source, tokenizer = moved["input"], moved["tokenizer"]
                        upload_s.append(done["uploaded"]["seconds"])
                        uploaded_bytes = done["uploaded"]["bytes"]
                expected = {k: v for k, v in local_hashes(out).items() if not k.startswith(("store.db", "."))}
                same = same and object_hashes(client, f"run{run}") == expected
    finally:
        server.terminate()
        server.wait(timeout=30)

    ratios = [s / loc for s, loc in zip(s3_s, local_s, strict=True)]
    ratio = statistics.median(ratios)
    upload = statistics.median(upload_s)
    print(f"corpus:  {args.tokens:,} tokens asked, {docs:,} documents; dataset {uploaded_bytes / 1e6:.1f} MB")
    print(f"local:   median {statistics.median(local_s):.2f} s  ({', '.join(f'{s:.2f}' for s in local_s)})")
    print(f"s3:      median {statistics.median(s3_s):.2f} s  ({', '.join(f'{s:.2f}' for s in s3_s)})")
    if driver:  # the tasks uploaded as they wrote: uploaded.seconds is the build's, uploads included
        print(f"upload:  by the Ray tasks, inside the build ({upload:.2f} s, tokenizing included)")
    else:
        print(
            f"upload:  median {upload:.2f} s, {upload / statistics.median(s3_s):.1%} of the s3 build, "
            f"{uploaded_bytes / 1e6 / upload:.0f} MB/s (moto on 127.0.0.1)"
        )
    print(f"ratio:   s3 / local = {ratio:.3f} (median of {len(ratios)} pairs; target <= {TARGET})")
    if driver:
        moved = statistics.median(driver)
        print(
            f"driver:  {moved:,.0f} B through the Ray driver, {moved / source:.2%} of the {source:,} B input "
            f"(the tokenizer {tokenizer:,} B once, then {(moved - tokenizer) / source:.2%}); its tasks "
            f"uploaded the {uploaded_bytes:,} B dataset, the driver stored meta.json and the marker only"
        )
    print(f"bytes:   every object equals the local build's file: {'yes' if same else 'NO'}")
    return 1 if not same or (args.check and ratio > TARGET) else 0


if __name__ == "__main__":
    sys.exit(main())
