"""`--engine ray` before any build: Ray missing, a cluster that cannot be reached, Ray kept out of local builds.

No Ray is started here: each failure must come before the output
directory is touched.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli


def build(tmp_path: Path, *extra: str) -> tuple[list[str], Path]:
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": f"Document {i}."}) + "\n" for i in range(5)))
    out = tmp_path / "out"
    return ["data", "build", "pretrain", "--from", str(source), "--out", str(out), *extra], out


def test_engine_ray_without_ray_installed_is_one_error_naming_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets when it is not installed
    args, out = build(tmp_path, "--engine", "ray")
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert result.output == (
        "error: --engine ray needs Ray, which is not installed\nhint: install it: pip install 'dlmstore[ray]'\n"
    )
    assert not out.exists()


@pytest.mark.parametrize("how", ["--ray-address", "RAY_ADDRESS"])
def test_a_ray_address_nobody_listens_on_is_one_error_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    pytest.importorskip("ray")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"  # closed again: connections are refused
    if how == "RAY_ADDRESS":
        monkeypatch.setenv("RAY_ADDRESS", address)
        args, out = build(tmp_path, "--engine", "ray")
    else:
        args, out = build(tmp_path, "--engine", "ray", "--ray-address", address)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert (
        result.output.splitlines()[0]
        == f"error: cannot reach the Ray cluster at {address}: Connection refused"
    )
    assert result.output.splitlines()[1].startswith("hint: check --ray-address / RAY_ADDRESS")
    assert not (out / "meta.json").exists() and not (out / "train").exists()


@pytest.mark.parametrize("command", ["build sft", "build-all"])
def test_sft_and_build_all_reach_the_cluster_before_creating_anything(tmp_path: Path, command: str) -> None:
    pytest.importorskip("ray")
    out = tmp_path / "out"
    source = tmp_path / "in"  # beside the output: an --out inside --from is refused before anything else
    source.mkdir()
    if command == "build sft":
        args = ["data", "build", "sft", "--from", str(source), "--out", str(out)]
    else:
        args = ["data", "build-all", "--cache-dir", str(out), "--only", "roam", "--local", f"roam={source}"]
    result = CliRunner().invoke(cli, [*args, "--engine", "ray", "--ray-address", "127.0.0.1:1"])
    assert result.exit_code == 1
    assert (
        result.output.splitlines()[0]
        == "error: cannot reach the Ray cluster at 127.0.0.1:1: Connection refused"
    )
    assert not out.exists()


@pytest.mark.slow
def test_a_ray_address_that_accepts_but_never_answers_is_an_error_not_a_hang(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        args, _ = build(tmp_path, "--engine", "ray", "--ray-address", address)
        code = f"from dlmstore.cli.main import cli; cli({args!r})"
        # the timeout only stops a hang from hanging the suite; the build gives up after 2.5 s (25 s unset)
        env = {**os.environ, "DLM_RAY_CONNECT_TIMEOUT": "2.5"}
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
        )
    assert done.returncode == 1
    assert f"error: the Ray cluster at {address} did not answer within 2.5 s" in done.stderr.splitlines()


@pytest.mark.parametrize("value", ["soon", "0", "-5", "inf"])
def test_a_connect_timeout_that_is_not_a_number_of_seconds_is_one_error_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    pytest.importorskip("ray")
    monkeypatch.setenv("DLM_RAY_CONNECT_TIMEOUT", value)
    out = tmp_path / "out"
    args, _ = build(tmp_path, "--engine", "ray", "--ray-address", "127.0.0.1:1")
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == (
        f"error: DLM_RAY_CONNECT_TIMEOUT={value!r} is not a number of seconds above 0"
    )
    assert not out.exists()


@pytest.mark.slow
def test_a_local_build_never_imports_ray(tmp_path: Path) -> None:
    args, out = build(tmp_path)
    code = (
        "import sys; from dlmstore.cli.main import cli\n"
        f"try:\n    cli({args!r})\nexcept SystemExit:\n    pass\n"
        "print('ray' in sys.modules, file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.strip().splitlines()[-1] == "False" and (out / "meta.json").exists()


def test_the_local_engine_rejects_ray_flags(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["data", "build", "sft", "--from", str(tmp_path), "--out", str(tmp_path / "o"), "--workers", "2"]
    )
    assert result.exit_code == 2 and "--ray-address and --workers need --engine ray" in result.output
