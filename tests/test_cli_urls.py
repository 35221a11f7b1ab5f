"""A URL where a path goes is refused by name, unless the option takes object storage (s3://).

Every path-taking option and argument of every command is found by walking
the click command tree, so a new one cannot be forgotten: a path is a
``LocalPath`` (``cli/params.py``), and text that holds a path
(``--dataset DIR[:WEIGHT]``, ``--local NAME=PATH``) a ``LocalPathText``.
The options that read or write token datasets in a bucket are a
``PathOrObject`` (a ``LocalPath`` that takes ``s3://``), listed in
:data:`TAKE_OBJECT_STORAGE`; they still refuse every other scheme by name
(what they do with ``s3://`` is tested in ``test_datasets_s3.py`` and
``test_train_s3.py``); ``--dataset`` takes ``s3://bucket/prefix[:WEIGHT]``
(a ``DatasetText``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.cli.params import DatasetText, LocalPath, LocalPathText, PathOrObject

from .helpers import leaf_commands

URLS = ["s3://bucket/prefix", "gs://bucket/ds", "az://container/ds", "https://example.com/doc.dlm",
        "hf://datasets/org/name", "file:///tmp/x"]  # fmt: skip


def _path_params() -> list[tuple[tuple[str, ...], click.Parameter]]:
    return [
        (path, param)
        for path, command in sorted(leaf_commands().items())
        for param in command.params
        if isinstance(param.type, (click.Path, LocalPathText))
    ]


def _id(case: tuple[tuple[str, ...], click.Parameter]) -> str:
    path, param = case
    return (
        " ".join(path)
        + " "
        + (param.opts[0] if isinstance(param, click.Option) else param.human_readable_name)
    )


PATH_PARAMS = _path_params()

#: The options that take ``s3://bucket/prefix`` as well as a local path.
TAKE_OBJECT_STORAGE = [
    "data build pretrain --from",
    "data build pretrain --out",
    "data build sft --from",
    "data build sft --out",
    "data show PATH",
    "data validate PATH",
    "train --dataset",
]
#: The types of those options: a path, or ``--dataset``'s ``DIR[:WEIGHT]`` text.
_OBJECT_TYPES = (PathOrObject, DatasetText)


def _refusal(param: click.Parameter, url: str) -> str:
    """What ``param`` says of ``url``: the local-only refusal, or (object storage) a scheme other than s3."""
    if isinstance(param.type, _OBJECT_TYPES):
        return (
            f"{url!r} is a URL; of object storage only s3:// is supported (any S3-compatible server), "
            "so give s3://bucket/prefix or a local path"
        )
    return f"{url!r} is a URL; object storage is not supported yet, so give a local path"


def _refused_cases() -> list[tuple[tuple[tuple[str, ...], click.Parameter], str]]:
    """Each path parameter with an s3:// and an https:// URL; s3:// only where it is refused."""
    return [
        (case, url)
        for case in PATH_PARAMS
        for url in (URLS[0], URLS[3])
        if not (isinstance(case[1].type, _OBJECT_TYPES) and url.startswith("s3://"))
    ]


def _cwd(tmp_path: Path, monkeypatch: Any) -> Path:
    """An empty working directory (the test's home is beside it, in ``tmp_path``)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def test_every_path_of_every_command_is_a_local_path() -> None:
    plain = [_id(case) for case in PATH_PARAMS if not isinstance(case[1].type, (LocalPath, LocalPathText))]
    assert plain == []


def test_the_options_that_take_object_storage_are_exactly_these() -> None:
    assert sorted(_id(case) for case in PATH_PARAMS if isinstance(case[1].type, _OBJECT_TYPES)) == sorted(
        TAKE_OBJECT_STORAGE
    )


def test_every_text_option_that_names_a_path_refuses_urls() -> None:
    texts = [
        _id((path, param))
        for path, command in leaf_commands().items()
        for param in command.params
        if isinstance(param, click.Option)
        and any(word in (param.metavar or "") for word in ("PATH", "DIR", "FILE"))
        and not isinstance(param.type, (click.Path, LocalPathText))
    ]
    assert texts == []


def _invocation(
    path: tuple[str, ...], command: click.Command, tested: click.Parameter, url: str
) -> list[str]:
    """``dlm PATH...`` with ``url`` for ``tested`` given first (click converts in command-line order)
    and a stand-in for every other required parameter."""
    options: list[str] = []
    arguments: list[str] = []
    for param in command.params:
        value = url if param is tested else "x"
        if param is not tested and not param.required:
            continue
        if isinstance(param, click.Argument):
            arguments.append(value)
        else:
            assert isinstance(param, click.Option)
            pair = [param.opts[0], value]
            options[:0] = pair if param is tested else []
            options += [] if param is tested else pair
    if isinstance(tested, click.Argument):
        return [*path, *arguments, *options]
    return [*path, *options, *arguments]


@pytest.mark.parametrize(("case", "url"), _refused_cases(), ids=lambda v: v if isinstance(v, str) else _id(v))
def test_a_url_is_refused_by_name_and_nothing_is_created(
    case: tuple[tuple[str, ...], click.Parameter], url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, param = case
    command = leaf_commands()[path]
    work = _cwd(tmp_path, monkeypatch)
    result = CliRunner().invoke(cli, _invocation(path, command, param, url))
    name = param.opts[0] if isinstance(param, click.Option) else param.human_readable_name
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1] == (
        f"Error: Invalid value for '{_named(param, name)}': {_refusal(param, url)}"
    )
    assert list(work.iterdir()) == []


def _named(param: click.Parameter, name: str) -> str:
    """How click names a parameter in its error: every spelling of an option, an argument's metavar."""
    if isinstance(param, click.Option):
        return "' / '".join(param.opts + param.secondary_opts)
    return name


@pytest.mark.parametrize("url", URLS[1:])
def test_each_kind_of_url_but_s3_is_refused_where_data_build_writes(
    url: str, tmp_path: Path, monkeypatch: Any
) -> None:
    work = _cwd(tmp_path, monkeypatch)
    (work / "texts").mkdir()
    result = CliRunner().invoke(cli, ["data", "build", "pretrain", "--from", "texts", "--out", url])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        f"Error: Invalid value for '--out': {url!r} is a URL; of object storage only s3:// is supported "
        "(any S3-compatible server), so give s3://bucket/prefix or a local path"
    )
    assert [p.name for p in work.iterdir()] == ["texts"]


def test_a_dataset_url_given_to_train_is_refused_by_name_unless_it_is_s3(
    tmp_path: Path, monkeypatch: Any
) -> None:
    _cwd(tmp_path, monkeypatch)
    result = CliRunner().invoke(cli, ["train", "--dataset", "gs://b/ds:2", "doc.dlm"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        "Error: Invalid value for '--dataset': 'gs://b/ds:2' is a URL; of object storage only s3:// is "
        "supported (any S3-compatible server), so give s3://bucket/prefix or a local path"
    )
    result = CliRunner().invoke(cli, ["train", "--dataset", "s3://b/ds:2", "doc.dlm"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1].startswith(
        "Error: Invalid value for '--dataset': 's3://b/ds': 'b' is not a bucket name"
    )


def test_a_local_path_with_a_colon_is_still_a_path(tmp_path: Path, monkeypatch: Any) -> None:
    work = _cwd(tmp_path, monkeypatch)
    result = CliRunner().invoke(cli, ["init", "notes:v2.dlm"])
    assert result.exit_code == 0, result.output
    assert (work / "notes:v2.dlm").is_file()


def test_a_url_after_the_name_of_a_local_source_is_refused_by_name(tmp_path: Path, monkeypatch: Any) -> None:
    work = _cwd(tmp_path, monkeypatch)
    result = CliRunner().invoke(
        cli, ["data", "build-all", "--local", "roam=gs://b/notes", "--cache-dir", "c"]
    )
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        "Error: Invalid value for '--local': 'gs://b/notes' is a URL; object storage is not supported yet, "
        "so give a local path"
    )
    assert list(work.iterdir()) == []
