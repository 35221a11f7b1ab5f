"""The template gallery: `dlm templates list` and `dlm init PATH --template NAME`.

Every template is written by `dlm init --template`, read by `dlm show` and
trained two steps by `dlm train` on the tiny base, so a template that stops
parsing or training fails here.
"""

from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.document.parser import parse_document, parse_text
from dlmstore.document.versions import CURRENT_DLM_VERSION
from dlmstore.errors import TemplateError
from dlmstore.eval.probes import marked_flags
from dlmstore.templates import listing
from dlmstore.templates.listing import list_templates
from dlmstore.ulid import is_valid_ulid

from .helpers import REPO

GALLERY = REPO / "dlmstore" / "templates" / "gallery"
NAMES = sorted(path.stem for path in GALLERY.glob("*.dlm"))
#: The jobs of DLM's gallery, each with a template here.
DLM_JOBS = [
    "changelog",
    "coding-tutor",
    "domain-kb",
    "meeting-notes",
    "personal-assistant",
    "regex-explainer",
    "shell-one-liners",
    "tool-use",
    "writing-partner",
]


def _init(path: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["init", str(path), *args])
    return result.exit_code, result.stdout, result.stderr


def test_the_gallery_holds_a_template_for_each_job_of_dlms_gallery() -> None:
    assert NAMES == DLM_JOBS
    assert [info.name for info in list_templates().templates] == NAMES


def test_templates_list_prints_each_templates_name_title_and_summary() -> None:
    result = CliRunner().invoke(cli, ["templates", "list"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["name", "title", "summary"]
    assert [line.split()[0] for line in lines[1:]] == NAMES
    tutor = next(line for line in lines if line.startswith("coding-tutor "))
    assert "Coding tutor (Python)" in tutor
    assert tutor.endswith("Explains Python ideas with a short example and when to use them.")


def test_templates_list_json_prints_every_template_with_its_metadata() -> None:
    result = CliRunner().invoke(cli, ["templates", "list", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert [item["name"] for item in payload["templates"]] == NAMES
    tool_use = next(item for item in payload["templates"] if item["name"] == "tool-use")
    assert tool_use == {
        "name": "tool-use",
        "title": "Tool use (JSON calls)",
        "summary": "Answers a request that needs a tool with one JSON call, and in words when none fits.",
        "domain_tags": ["tool-use", "agent", "json"],
        "recommended_base": "smollm2-135m",
        "sample_prompts": ["Is it raining in Oslo?", "Convert 99 dollars to yen."],
    }


@pytest.mark.parametrize("name", NAMES)
def test_each_template_names_its_base_has_probes_and_prompts_and_trains_briefly(name: str) -> None:
    (info,) = [info for info in list_templates().templates if info.name == name]
    document = parse_document(GALLERY / f"{name}.dlm")
    front = document.frontmatter
    assert front.base_model == info.recommended_base == "smollm2-135m"
    assert front.dlm_version == CURRENT_DLM_VERSION
    assert is_valid_ulid(front.dlm_id)
    assert front.training.max_steps is not None and front.training.max_steps <= 30
    assert front.training.sequence_len <= 512
    probes = [
        flag
        for section in document.sections
        if section.type == "instruction"
        for flag in marked_flags(section)
    ]
    assert probes.count(True) >= 2 and len(probes) >= 5
    assert len(info.sample_prompts) >= 2 and info.title and info.summary


@pytest.mark.parametrize("name", NAMES)
def test_each_template_inits_shows_and_trains_two_steps_on_the_tiny_base(
    name: str, tmp_path: Path, tiny_base: Path
) -> None:
    doc = tmp_path / f"{name}.dlm"
    code, _, stderr = _init(doc, "--template", name, "--base-model", str(tiny_base))
    assert code == 0, stderr
    runner = CliRunner()
    shown = runner.invoke(cli, ["show", str(doc), "--json"])
    assert shown.exit_code == 0, shown.output
    trained = runner.invoke(cli, ["-q", "train", str(doc), "--max-steps", "2", "--json"])
    assert trained.exit_code == 0, trained.output
    assert json.loads(trained.stdout)["adapter_path"]


def test_init_from_a_template_writes_it_with_a_fresh_id_and_nothing_else_changed(tmp_path: Path) -> None:
    code, stdout, _ = _init(tmp_path / "tutor.dlm", "--template", "coding-tutor", "--json")
    assert code == 0
    result = json.loads(stdout)
    assert (result["template"], result["base_model"]) == ("coding-tutor", "smollm2-135m")
    assert Path(result["store_path"]).is_dir()
    written = (tmp_path / "tutor.dlm").read_text(encoding="utf-8")
    original = (GALLERY / "coding-tutor.dlm").read_text(encoding="utf-8")
    assert parse_text(written).frontmatter.dlm_id == result["dlm_id"]
    assert written.replace(result["dlm_id"], "") == original.replace(
        parse_text(original).frontmatter.dlm_id, ""
    )


def test_two_documents_from_one_template_get_two_ids(tmp_path: Path) -> None:
    ids = []
    for path in (tmp_path / "one.dlm", tmp_path / "two.dlm"):
        code, stdout, _ = _init(path, "--template", "domain-kb", "--json")
        assert code == 0
        ids.append(json.loads(stdout)["dlm_id"])
    original = parse_document(GALLERY / "domain-kb.dlm").frontmatter.dlm_id
    assert len({*ids, original}) == 3


def test_a_base_model_given_with_a_template_replaces_the_templates_base(
    tmp_path: Path, tiny_base: Path
) -> None:
    code, stdout, stderr = _init(
        tmp_path / "kb.dlm", "--template", "domain-kb", "--base-model", str(tiny_base)
    )
    assert code == 0, stderr
    assert stdout.splitlines()[0] == f"wrote {tmp_path / 'kb.dlm'} from template domain-kb"
    assert parse_document(tmp_path / "kb.dlm").frontmatter.base_model == str(tiny_base)


def test_an_unknown_template_is_refused_with_the_names_of_the_gallery(tmp_path: Path) -> None:
    code, _, stderr = _init(tmp_path / "x.dlm", "--template", "codng-tutor")
    assert code == 1
    assert stderr.splitlines() == [
        f"error: no template named 'codng-tutor'; the templates are: {', '.join(NAMES)}",
        "hint: `dlm templates list` shows each with its summary",
    ]
    assert not (tmp_path / "x.dlm").exists()


def test_init_from_a_template_never_overwrites_an_existing_file(tmp_path: Path) -> None:
    doc = tmp_path / "mine.dlm"
    doc.write_text("my own words\n", encoding="utf-8")
    code, _, stderr = _init(doc, "--template", "changelog")
    assert code == 1
    assert stderr.splitlines()[0] == f"error: {doc}: already exists; dlm init never overwrites a document"
    assert doc.read_text(encoding="utf-8") == "my own words\n"


def test_a_meta_yaml_with_an_unknown_key_or_another_name_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "demo.dlm").write_text((GALLERY / "changelog.dlm").read_text(encoding="utf-8"))
    meta = tmp_path / "demo.meta.yaml"
    monkeypatch.setattr(listing, "_gallery", lambda: tmp_path)
    base = "title: T\nsummary: S\nrecommended_base: smollm2-135m\n"
    meta.write_text("name: demo\n" + base + "expected_hours: 3\n")
    with pytest.raises(
        TemplateError, match=r"^template 'demo': demo.meta.yaml: unknown key 'expected_hours'$"
    ):
        list_templates()
    meta.write_text("name: other\n" + base)
    with pytest.raises(TemplateError, match=r"name is 'other'; it must be the file's stem 'demo'$"):
        list_templates()
    meta.unlink()
    with pytest.raises(TemplateError, match=r"^template 'demo' has no demo.meta.yaml beside its document$"):
        list_templates()


def test_the_wheel_carries_every_file_of_the_gallery() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "dlmstore.templates" in config["packages"]
    patterns = config["package-data"]["dlmstore.templates"]
    files = sorted(str(path.relative_to(GALLERY.parent)) for path in GALLERY.iterdir())
    assert files and all(any(fnmatch.fnmatch(name, pattern) for pattern in patterns) for name in files)
