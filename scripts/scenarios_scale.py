"""Past one machine (docs/scale.md): a dataset in a bucket, a Ray build reading its own input, two nodes.

The bucket is a real S3-protocol server, moto's, on 127.0.0.1:9000, started
in the generator's own process by the first step (a thread: it ends with
the generator, so nothing is left running) and shown as the ``moto_server``
command a reader would type. ``dlm`` reaches it over HTTP from its own
processes, as it would reach MinIO or S3. The model is the built-in
SmolLM2-135M, trained for a few steps: the session shows the commands, their
bytes and identities, not what the model learns.
"""

from __future__ import annotations

import os
from pathlib import Path

from session_steps import shell  # scripts/ is on sys.path when this runs
from sessions import SHOWN, Scenario, Step

PORT = 9000
ENDPOINT = f"http://127.0.0.1:{PORT}"
KEYS = {"AWS_ACCESS_KEY_ID": "dlm", "AWS_SECRET_ACCESS_KEY": "dlm-secret", "AWS_DEFAULT_REGION": "us-east-1"}
GARDEN_ID = "01MBSC4KE0GARDENB0CKETS3AA"

DOC = f"""---
dlm_id: {GARDEN_ID}
base_model: smollm2-135m
training:
  sequence_len: 64
  max_steps: 4
  micro_batch_size: 2
  seed: 42
  datasets:
    - path: s3://garden/web
      weight: 2
---
The beds are watered at dawn; the compost is turned every second week.
"""

_server: list[object] = []  # the one server of this generator process


def start_server(work: Path) -> str:
    """``moto_server -p 9000 &``, the ``export`` and the bucket: a real S3 server on 127.0.0.1."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto logs every request
    if not _server:
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=PORT, verbose=False)
        server.start()
        _server.append(server)
    else:  # a second scenario run in the same process: start from an empty server
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{ENDPOINT}/moto-api/reset", method="POST"))
    os.environ.update({"AWS_ENDPOINT_URL_S3": ENDPOINT, **KEYS})
    boto3.client("s3", endpoint_url=ENDPOINT, **{k.lower(): v for k, v in KEYS.items() if "KEY" in k},
                 region_name="us-east-1").create_bucket(Bucket="garden")  # fmt: skip
    return ""


start_server.__name__ = f"moto_server({PORT}, {sorted(KEYS.items())!r}, bucket garden)"


def upload_raw(work: Path) -> str:
    """``boto3.client('s3').upload_file('docs.jsonl', 'garden', 'raw/docs.jsonl')``, as shown."""
    import boto3

    boto3.client("s3").upload_file(str(work / "docs.jsonl"), "garden", "raw/docs.jsonl")
    return ""


SCALE = Scenario(
    name="scale",
    model="real",
    shown=SHOWN,
    files={"garden.dlm": DOC},
    steps=(
        Step(
            "bucket",
            (
                f"moto_server -H 127.0.0.1 -p {PORT} &          # an S3-protocol server (pip install 'moto[server]')",
                f"export AWS_ENDPOINT_URL_S3={ENDPOINT} AWS_ACCESS_KEY_ID=dlm AWS_SECRET_ACCESS_KEY=dlm-secret",
                "python -c \"import boto3; boto3.client('s3').create_bucket(Bucket='garden')\"",
            ),
            start_server,
        ),
        shell(
            "bucket",
            'seq 3000 | sed \'s/.*/{"text": "Note &: the beds are watered at dawn, the compost turned."}/\' > docs.jsonl',
            joined=True,
        ),
        Step(
            "bucket",
            ("dlm data build pretrain --from docs.jsonl --out s3://garden/web",),
            ("data", "build", "pretrain", "--from", "docs.jsonl", "--out", "s3://garden/web"),
            joined=True,
        ),
        Step("bucket", ("dlm data show s3://garden/web",), ("data", "show", "s3://garden/web")),
        Step("train", ("dlm train garden.dlm",), ("train", "garden.dlm")),
        shell("train", "ls $DLM_HOME/cache/objects"),
        Step(
            "ray",
            (
                "python -c \"import boto3; boto3.client('s3').upload_file('docs.jsonl', 'garden', 'raw/docs.jsonl')\"",
            ),
            upload_raw,
        ),
        Step(
            "ray",
            ("dlm data build pretrain --from s3://garden/raw --out web2 --engine ray --workers 2",),
            (
                "data",
                "build",
                "pretrain",
                "--from",
                "s3://garden/raw",
                "--out",
                "web2",
                "--engine",
                "ray",
                "--workers",
                "2",
            ),  # fmt: skip
            joined=True,
        ),
        shell(
            "nodes",
            "export GLOO_SOCKET_IFNAME=lo\n"
            "dlm -q train garden.dlm --fresh --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 29533 &\n"
            "dlm -q train garden.dlm --fresh --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 29533; wait",
        ),
    ),
)
