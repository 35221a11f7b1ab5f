"""The garbage collector paused while a corpus is built."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

from dlmstore.collector import frozen, paused

from .helpers import write_doc


def test_the_collector_is_off_in_a_pause_and_on_after_with_what_it_built_out_of_the_young_generation() -> (
    None
):
    assert gc.isenabled()
    with paused():
        assert not gc.isenabled()
        built = [[index] for index in range(5000)]  # 5,000 tracked objects
        assert gc.get_count()[0] >= 5000
    assert gc.isenabled()
    assert gc.get_count()[0] < 100  # moved on: the next collection will not walk them
    assert len(built) == 5000 and gc.get_freeze_count() == 0  # nothing left frozen


def test_a_pause_inside_a_pause_or_with_the_collector_off_leaves_it_off() -> None:
    with paused():
        with paused():
            pass
        assert not gc.isenabled()
    gc.disable()
    try:
        with paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_finished_dlm_command_leaves_nothing_for_the_shutdown_collection_to_traverse(
    tmp_path: Path,
) -> None:
    doc = write_doc(tmp_path / "doc.dlm", "Some prose.\n")
    script = (
        "import atexit, gc, sys\n"
        # registered before dlm's handler, so it runs after it (atexit is last in, first out)
        "atexit.register(lambda: sys.stderr.write(f'frozen at exit: {gc.get_freeze_count()}\\n'))\n"
        "from dlmstore.cli.main import cli\n"
        f"cli(['show', {str(doc)!r}])\n"
    )
    env = {**os.environ, "DLM_HOME": str(tmp_path / "home")}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("frozen at exit:")]
    assert int(line.split(":")[1]) > 10_000  # every live object: the modules, the store, the document


def test_a_frozen_block_keeps_what_was_alive_before_it_out_of_the_collectors_sight_and_gives_it_back() -> (
    None
):
    gc.unfreeze()
    before = gc.get_freeze_count()
    alive = [[index] for index in range(1000)]  # tracked containers, alive through the block
    with frozen():
        assert gc.get_freeze_count() >= before + len(alive)
        made = [[index] for index in range(10)]
        gc.collect()  # a full collection walks none of the frozen objects
        assert gc.get_freeze_count() >= before + len(alive)
    assert gc.get_freeze_count() == 0
    assert len(made) == 10 and len(alive) == 1000
