"""A real S3-protocol server on 127.0.0.1 for the tests, and a proxy that can cut it off.

The server is moto's ``ThreadedMotoServer`` (werkzeug serving moto's S3
over HTTP) on a free port of 127.0.0.1, as s3fs's and datatrove's suites
run it: never an in-process mock of the client, so dlm's own boto3 client,
CLI subprocesses, Ray workers and training ranks all reach it the same
way, over real HTTP. One server serves the whole session (``conftest.py``
starts it for the first test that asks and stops it at the end); each test
resets it (``POST /moto-api/reset``: every bucket and object gone, auth
off) and gets a fresh bucket. moto keeps its state per process, so every
server and proxy here fronts the same buckets.

:class:`CutProxy` sits between a client and the server and stops passing
anything once a number of request bytes went through: the connection is
closed and the port refuses connections from then on, as a server that
stops answering mid-upload or mid-download would.
"""

from __future__ import annotations

import logging
import socket
import threading
import urllib.request
from dataclasses import dataclass
from typing import Any

#: The tests' credentials and region (moto accepts any unless auth is switched on).
ACCESS_KEY = "dlm-test-key"
SECRET_KEY = "dlm-test-secret"
REGION = "us-east-1"
BUCKET = "dlm-test"


class S3Server:
    """moto's S3 server on 127.0.0.1 and a free port, started on construction."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"

    def _post(self, path: str, body: bytes = b"") -> None:
        request = urllib.request.Request(  # not a form: werkzeug would take the body as form fields
            self.endpoint + path, data=body, method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def reset(self) -> None:
        """Forget every bucket and object, and accept any credentials again."""
        self._post("/moto-api/reset")
        self._post("/moto-api/reset-auth", b"inf")

    def require_auth(self) -> None:
        """Check every request's credentials from now on (until :meth:`reset`): unknown keys are refused."""
        self._post("/moto-api/reset-auth", b"0")

    def stop(self) -> None:
        self._server.stop()


def client_for(endpoint: str) -> Any:
    """A plain boto3 S3 client of the tests' own (not dlm's), path-style, for ``endpoint``."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
        config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "max_attempts": 1}),
    )


@dataclass(frozen=True)
class S3Bucket:
    """The ``s3`` fixture: a fresh bucket on the session's server, the environment pointed at it."""

    endpoint: str
    bucket: str
    client: Any
    server: S3Server

    def url(self, prefix: str) -> str:
        """``s3://<bucket>/<prefix>``."""
        return f"s3://{self.bucket}/{prefix.strip('/')}" if prefix.strip("/") else f"s3://{self.bucket}"

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under ``prefix``, sorted."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def read(self, key: str) -> bytes:
        """One object's bytes."""
        return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def put(self, key: str, data: bytes) -> None:
        """Write one object."""
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)


class CutProxy:
    """A TCP proxy on 127.0.0.1 to ``target_port`` that cuts everything off after ``allow`` request bytes.

    Once that many bytes went from clients to the server, every open
    connection is closed (shut down: what was already forwarded still
    arrives) and the listening socket closed, so retries find
    the port refusing connections: a server gone mid-transfer. With
    ``hang``, connections stay open instead and new ones are still taken,
    but nothing passes either way any more: a server that stops answering
    (the client's read timeout is what ends a request).
    """

    def __init__(self, target_port: int, allow: int, *, hang: bool = False) -> None:
        self._target = target_port
        self._allow = allow
        self._hang = hang
        self._passed = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.cut = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self._hang or not self.cut.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._target))
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        try:
            while data := source.recv(65536):
                if counted:
                    with self._lock:
                        self._passed += len(data)
                        over = self._passed > self._allow
                    if over and not self._hang:
                        self.close()
                        return
                    if over:
                        self.cut.set()
                if self.cut.is_set() and self._hang:
                    continue  # swallowed: the server has stopped answering
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                _close(end)

    def close(self) -> None:
        """Cut every connection and stop listening."""
        self.cut.set()
        _close(self._listener)
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for end in sockets:
            try:  # what was sent arrives, then the end: as the connections of a server that died end.
                # A close() alone leaves the connection open while another thread still waits in
                # recv() on it (the client would then wait out its read timeout): shut it down first.
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            _close(end)


def _close(end: socket.socket) -> None:
    try:
        end.close()
    except OSError:
        pass
