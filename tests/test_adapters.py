"""Adapter versions and their phases: sft, then preference versions started from an sft one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlmstore.store.database import Store, open_store
from dlmstore.store.runs import start_run
from dlmstore.train.adapters import VERSIONS_DIR, AdapterVersion, latest, save_version

from .helpers import VALID_ID

DOC = Path("/tmp/doc.dlm")


def _writer(content: bytes) -> Any:
    def write(folder: Path) -> None:
        (folder / "adapter_model.safetensors").write_bytes(content)

    return write


def _save(store: Store, run_id: int, content: bytes, **phase: Any) -> AdapterVersion:
    return save_version(
        store,
        run_id=run_id,
        write=_writer(content),
        base_model="smollm2-135m",
        steps=2,
        final_loss=1.5,
        **phase,
    )


def test_a_run_of_both_phases_registers_an_sft_version_then_a_preference_version_started_from_it() -> None:
    with open_store(VALID_ID) as store:
        run_id = start_run(store, command="train", dlm_path=DOC, dlm_sha256="ab")
        sft = _save(store, run_id, b"sft")
        preference = _save(
            store, run_id, b"dpo", phase="preference", method="dpo", parent_version=sft.version
        )
        assert (sft.version, sft.phase, sft.method, sft.parent_version) == (1, "sft", None, None)
        assert (preference.version, preference.phase, preference.method, preference.parent_version) == (
            2, "preference", "dpo", 1,
        )  # fmt: skip
        assert preference.path == f"{VERSIONS_DIR}/v0002"
        assert latest(store) == preference
        assert latest(store, phase="sft") == sft
        assert latest(store, phase="preference") == preference


def test_latest_of_a_phase_skips_newer_adapters_of_the_other_phase() -> None:
    with open_store(VALID_ID) as store:
        assert latest(store) is None and latest(store, phase="sft") is None
        first = start_run(store, command="train", dlm_path=DOC, dlm_sha256="ab")
        sft = _save(store, first, b"sft")
        second = start_run(store, command="train", dlm_path=DOC, dlm_sha256="ab")
        orpo = _save(store, second, b"orpo", phase="preference", method="orpo", parent_version=sft.version)
        assert latest(store, phase="sft") == sft
        assert latest(store) == orpo
        assert latest(store, phase="preference") == orpo


@pytest.mark.parametrize(
    ("phase", "message"),
    [
        ({"phase": "preference", "method": "dpo"}, "preference adapters need method dpo or orpo"),
        ({"phase": "preference", "parent_version": 1}, "preference adapters need method dpo or orpo"),
        ({"phase": "sft", "method": "dpo"}, "sft adapters have neither"),
        ({"phase": "reward"}, "an adapter of phase 'reward'"),
        ({"phase": "preference", "method": "dpo", "parent_version": 7}, "7 is not a registered sft"),
        ({"phase": "preference", "method": "dpo", "parent_version": 2}, "2 is not a registered sft"),
    ],
)
def test_an_adapter_whose_origin_does_not_fit_its_phase_is_refused_before_anything_is_written(
    phase: dict[str, Any], message: str
) -> None:
    with open_store(VALID_ID) as store:
        run_id = start_run(store, command="train", dlm_path=DOC, dlm_sha256="ab")
        sft = _save(store, run_id, b"sft")
        other = start_run(store, command="train", dlm_path=DOC, dlm_sha256="ab")
        dpo = _save(store, other, b"dpo", phase="preference", method="dpo", parent_version=sft.version)
        with pytest.raises(ValueError, match=message):
            _save(store, run_id, b"bad", **phase)
        assert sorted(p.name for p in (store.path / VERSIONS_DIR).iterdir()) == ["v0001", "v0002"]
        assert (latest(store), latest(store, phase="sft")) == (dpo, sft)


def test_a_second_adapter_of_the_same_phase_in_one_run_is_refused_before_anything_is_written() -> None:
    with open_store(VALID_ID) as store:
        run_id = start_run(store, command="train", dlm_path=DOC, dlm_sha256="ab")
        _save(store, run_id, b"sft")
        with pytest.raises(ValueError, match="run 1 has already registered its sft adapter"):
            _save(store, run_id, b"again")
        assert [p.name for p in (store.path / VERSIONS_DIR).iterdir()] == ["v0001"]
