"""`dlm report` says what happened in each train run: how long it took, why it failed, each phase's steps
and final and best loss, and which passes did not use the cache (#32 item 2)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.store.database import open_store
from dlmstore.train.adapters import save_version

from .helpers import VALID_ID
from .test_metrics_runs import doc  # noqa: F401  (the fixture: a finished run, a failed --no-cache run, a running one)


def test_the_report_carries_each_train_runs_duration_error_phases_and_cache_bypass(
    doc: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    out = tmp_path / "report.html"
    result = CliRunner().invoke(cli, ["report", str(doc), "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert "<h3>Run 1 · completed · started 2026-11-23T03:00:00.000Z · took 15 min 02 s</h3>" in page
    assert "<h3>Run 2 · failed · started 2026-11-23T04:00:00.000Z · took 42.1 s</h3>" in page
    assert '<p class="meta">failed: train rank 1 was killed by SIGKILL</p>' in page
    assert (
        '<p class="meta">run 1 sft: 4 steps, final loss 2.7500, best 2.5000 at step 2 · '
        "run 1 preference: 3 steps, final loss 0.6500, best 0.6000 at step 2</p>"
    ) in page
    assert "Cache not used (run 2 bypassed: bypassed is <code>--no-cache</code>" in page


def test_the_adapters_table_wraps_each_sha256_so_it_and_created_fit_a_1280_pixel_window(
    doc: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    # checked by eye in headless Chromium at --window-size=1280,900: every column visible, each sha256
    # on three lines of its cell (the sha class), the created time beside it
    with open_store(VALID_ID) as store:
        save_version(
            store, run_id=1, write=lambda folder: (folder / "adapter_model.safetensors").write_bytes(b"w"),
            base_model="smollm2-135m", steps=4, final_loss=2.75, phase="sft", method=None, parent_version=None,
        )  # fmt: skip
    out = tmp_path / "report.html"
    assert CliRunner().invoke(cli, ["report", str(doc), "-o", str(out)]).exit_code == 0
    page = out.read_text()
    assert "code.sha { word-break: break-all;" in page
    assert '<td><code class="sha">sha256:' in page
