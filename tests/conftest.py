"""Shared fixtures: every test gets its own DLM_HOME; nothing touches the network.

Object storage is the one server a test may reach: ``s3`` gives a test a
fresh bucket on a real S3-protocol server on 127.0.0.1 (``s3_server.py``),
and points the AWS environment at it. Every other test runs with that
environment pointed at a closed port of 127.0.0.1 and no AWS profile,
credentials file or instance metadata, so no test reaches any other address.

The SmolLM2 base is converted from its GGUF file at most once per test
session, into a session directory that each test's home links to as
``bases/``, so tests that need the real tokenizer pay ~5 s once, not per test.

Tests that only need *a* causal LM to train or prompt use ``tiny_base``: a
random-weight model of SmolLM2's architecture scaled down to a few layers
and dimensions, with the real SmolLM2 tokenizer, saved once per session as
a local-folder base (``base_model: <folder>``). It trains in a fraction of
the real model's time; the real model stays in the end-to-end tests (the
determinism golden, TRL parity, the demo path).

Plain helpers (``write_doc``, ``make_lock``, ``WordTokenizer``, ...) are in
``helpers.py``; fixtures are here, so no test module imports another.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from .s3_server import S3Bucket, S3Server

os.environ["HF_HUB_OFFLINE"] = "1"

# No per-example deadline: CI machines are shared and a slow example is not a bug.
settings.register_profile("dlm", deadline=None)
settings.load_profile("dlm")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

#: SmolLM2-135M's LlamaConfig with every size cut down; everything that
#: shapes behaviour (vocabulary, special token ids, tied embeddings, RoPE,
#: grouped-query attention, activation) is kept as the real model has it.
TINY_SMOLLM2_CONFIG: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}

#: Seed of the tiny model's random weights: every session builds the same bytes.
TINY_SEED = 0


#: Variables that could lead a client elsewhere than the tests' server: unset for the session.
_AWS_ELSEWHERE = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
)


@pytest.fixture(scope="session", autouse=True)
def _object_storage_goes_nowhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Point the AWS environment at a closed port of 127.0.0.1 for the whole session.

    The port is bound and never listened on, so a connection is refused at
    once and no other process can take the port. No profile, config or
    credentials file and no instance metadata are read. The ``s3`` fixture
    points a test at the real server instead.
    """
    import socket

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}"
    missing = tmp_path_factory.mktemp("no-aws") / "absent"
    with pytest.MonkeyPatch.context() as patch:
        for name in _AWS_ELSEWHERE:
            patch.delenv(name, raising=False)
        patch.setenv("AWS_ENDPOINT_URL_S3", nowhere)
        patch.setenv("AWS_ENDPOINT_URL", nowhere)
        patch.setenv("AWS_CONFIG_FILE", str(missing))
        patch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(missing))
        patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        yield
    closed.close()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1, started by the first test that asks, stopped at the session's end."""
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Bucket:
    """A fresh bucket on the session's S3 server (reset first), the AWS environment pointed at it.

    Set in ``os.environ``, so CLI subprocesses, Ray workers and training
    ranks started by the test reach the same server.
    """
    from .s3_server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, client_for

    s3_server.reset()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    client = client_for(s3_server.endpoint)
    client.create_bucket(Bucket=BUCKET)
    return S3Bucket(endpoint=s3_server.endpoint, bucket=BUCKET, client=client, server=s3_server)


@pytest.fixture(scope="session")
def session_bases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bases")


@contextmanager
def _session_home(session_bases: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A DLM_HOME sharing the session's bases/, for session fixtures (dlm_home is per test)."""
    home = tmp_path_factory.mktemp("session-home")
    (home / "bases").symlink_to(session_bases, target_is_directory=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DLM_HOME", str(home))
        yield home


@pytest.fixture(autouse=True)
def dlm_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, session_bases: Path) -> Path:
    """Point DLM_HOME at a fresh directory whose bases/ is shared by the session."""
    home = tmp_path / "dlm-home"
    home.mkdir()
    (home / "bases").symlink_to(session_bases, target_is_directory=True)
    monkeypatch.setenv("DLM_HOME", str(home))
    return home


@pytest.fixture
def smollm2_tokenizer():  # type: ignore[no-untyped-def]
    """The real SmolLM2-135M-Instruct tokenizer, loaded offline, a fresh object per test."""
    from dlmstore.bases import load_tokenizer, resolve_base

    return load_tokenizer(resolve_base("smollm2-135m"))


@pytest.fixture(scope="session")
def tokenizer(session_bases: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The real SmolLM2-135M-Instruct tokenizer, loaded once per session, offline (do not mutate)."""
    with _session_home(session_bases, tmp_path_factory):
        from dlmstore.bases import load_tokenizer, resolve_base

        return load_tokenizer(resolve_base("smollm2-135m"))


@pytest.fixture(scope="session")
def encoder(tokenizer: Any) -> Any:
    """A TextEncoder over the real tokenizer, shared so builds skip re-cloning it."""
    from dlmstore.datasets.build.encoding import TextEncoder

    return TextEncoder(tokenizer)


@pytest.fixture(scope="session")
def tiny_base(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local-folder base: SmolLM2's architecture, tiny and randomly initialised, its real tokenizer.

    Built once per session (about 13 MB of float32 weights, nearly all of it
    the tied 49152 x 64 embedding) with a fixed seed; write
    ``base_model: <this folder>`` in a document to train or prompt on it.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    folder = tmp_path_factory.mktemp("tiny-smollm2")
    with torch.random.fork_rng(devices=[]):  # leave the session's global RNG alone
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(LlamaConfig(**TINY_SMOLLM2_CONFIG))
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # save_pretrained draws one per shard
    try:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return folder


@pytest.fixture(scope="module")
def trained_store(tiny_base: Path, session_bases: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store whose adapter v1 was trained on ``tiny_base`` by ``helpers.export_doc`` (once per module).

    Copy it into a test's home (``shutil.copytree`` to ``dlm_home / "store" / VALID_ID``) and write
    the document with ``export_doc`` to export, prompt or evaluate without training again.
    """
    import torch

    from .helpers import VALID_ID, export_doc

    home = tmp_path_factory.mktemp("export-home")
    (home / "bases").symlink_to(session_bases, target_is_directory=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DLM_HOME", str(home))
        from dlmstore.train.trainer import train_document

        train_document(str(export_doc(tmp_path_factory.mktemp("export-doc"), tiny_base)))
    torch.set_num_threads(threads)
    return home / "store" / VALID_ID


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Train the tiny base on one torch thread, then restore the count.

    Its steps are many small ops, and on a shared 2-core machine a second
    OpenMP thread waiting for a busy core made each step about 4x slower
    (measured: ~1 s against ~0.27 s). The count is restored because the
    golden's runtime tuple records it.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
