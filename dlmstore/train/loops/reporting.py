"""``training.report_to``: the trainer's logs sent where ML people already look.

dlmstore records every logged step in ``store.db`` whatever this key says
(``dlm metrics``, ``dlm report``). ``report_to`` adds TRL's own reporters
beside that, passed through as ``TrainingArguments.report_to``:

* ``tensorboard``: event files under the store, one folder per run and
  phase, ``<store>/runs/<run id>/tb/<phase>`` (``tensorboard --logdir
  <store>/runs`` shows every run). transformers 5 has no
  ``logging_dir`` argument any more; its TensorBoard callback reads the
  ``TENSORBOARD_LOGGING_DIR`` environment variable when the trainer is
  built, so :func:`reporting` sets it for exactly that moment and puts the
  previous value back. (The trainer's own ``output_dir`` is a temporary
  folder removed after the phase, so its default would lose the files.)
* ``trackio``: Trackio's local database (its own default folder), project
  ``dlmstore``, one run named ``<dlm_id> run <N> <phase>``.

Each reporter is an optional package with a pip extra of the same name;
:func:`dlmstore.train.plan.check_settings` refuses a missing one before the
model loads. Reporters see the logs; they never change the adapter's bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: The environment variable transformers' TensorBoard callback reads its folder from.
TENSORBOARD_ENV = "TENSORBOARD_LOGGING_DIR"

#: Trackio's project for every dlmstore run.
TRACKIO_PROJECT = "dlmstore"


def tensorboard_dir(store_path: Path, run_id: int, phase: str) -> Path:
    """Where run ``run_id``'s ``phase`` writes its TensorBoard event files."""
    return store_path / "runs" / str(run_id) / "tb" / phase


@contextmanager
def reporting(
    report_to: tuple[str, ...], *, store_path: Path, dlm_id: str, run_id: int, phase: str
) -> Iterator[dict[str, Any]]:
    """Build the trainer inside this block: it yields the extra ``TrainingArguments`` keys.

    With no reporter it yields ``{}`` and changes nothing. With
    ``tensorboard`` the event folder is created and named to transformers
    through :data:`TENSORBOARD_ENV` until the block ends; with any reporter
    the run gets a name (``run_name``, and Trackio's ``project``).
    """
    if not report_to:
        yield {}
        return
    names: dict[str, Any] = {"run_name": f"{dlm_id} run {run_id} {phase}"}
    if "trackio" in report_to:
        names["project"] = TRACKIO_PROJECT
    if "tensorboard" not in report_to:
        yield names
        return
    folder = tensorboard_dir(store_path, run_id, phase)
    folder.mkdir(parents=True, exist_ok=True)
    before = os.environ.get(TENSORBOARD_ENV)
    os.environ[TENSORBOARD_ENV] = str(folder)
    try:
        yield names
    finally:
        if before is None:
            os.environ.pop(TENSORBOARD_ENV, None)
        else:
            os.environ[TENSORBOARD_ENV] = before
