"""The saves ``dlm train --watch`` acts on, gathered by watchfiles on background threads.

What is watched: the document's folder (not recursively; only the document
itself counts) and each ``training.sources`` directive's root (a folder
recursively, a file through its folder). A folder is watched rather than
the file, so an editor that saves by writing a temporary file and renaming
it over the document is seen as a save of the document.

What is left out: the store's own writes (anything under the dlm home),
editors' temporary and swap files and the folders watchfiles' default
filter leaves out (``.git``, ``__pycache__``, ...).

Why threads: watchfiles' blocking wait checks for signals itself and turns
any into a plain ``KeyboardInterrupt``, so a SIGTERM would read as a Ctrl-C.
On a thread of its own it never sees them; the main thread waits on a
condition, where Ctrl-C and SIGTERM raise as they do in every other command.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlmstore.document.parser import Document

_log = logging.getLogger(__name__)

#: Names editors and downloaders write beside a file before they rename it over it, or next to it.
_TEMPORARY = re.compile(
    r"(\.(tmp|temp|part|crdownload|bak|orig)$)|(^#.*#$)|(^4913$)|(^\.#)|(~$)|(\.sw[a-p]$)"
)

#: How long a watcher thread waits for the stop event between checks, in ms.
_STEP_MS = 50


@dataclass(frozen=True)
class Watched:
    """One path watchfiles watches, and what under it counts as a save.

    Attributes:
        root: the folder watched.
        recursive: whether its sub-folders are watched too.
        only: the one file under it that counts, or ``None`` when every file does.
    """

    root: str
    recursive: bool
    only: str | None


def watched_paths(document: Document) -> tuple[Watched, ...]:
    """The document's folder (for the document alone) and its sources' roots that exist now."""
    from dlmstore.sources.roots import anchor_dir, source_root

    doc = os.path.realpath(document.path)
    paths = [Watched(os.path.dirname(doc), False, doc)]
    anchor = anchor_dir(document.directory)
    for directive in document.frontmatter.training.sources:
        root = source_root(directive.path, anchor)
        if root is None:
            continue  # nothing there yet: the run says so; the next save of the document looks again
        if os.path.isdir(root):
            paths.append(Watched(root, True, None))
        else:
            paths.append(Watched(os.path.dirname(root), False, root))
    return tuple(dict.fromkeys(paths))


def counts(path: str, watched: Watched, home: str) -> bool:
    """Whether a change of ``path`` seen under ``watched`` is a save that may change a row."""
    if watched.only is not None:
        return os.path.realpath(path) == watched.only
    if path == home or path.startswith(home + os.sep):
        return False  # the store's own writes
    if os.path.isdir(path):
        return False  # a folder's own change (polling sees one per file added): its files are reported
    return _TEMPORARY.search(os.path.basename(path)) is None


class Saves:
    """Saves gathered since the last :meth:`settled`, from watcher threads.

    Use as a context manager: leaving it stops and joins the threads.
    """

    def __init__(self, *, force_polling: bool | None = None) -> None:
        from dlmstore.home import dlm_home

        self._home = os.path.realpath(dlm_home())
        self._force_polling = force_polling
        self._changed: dict[str, None] = {}
        self._last = 0.0
        self._batches = 0  # batches of saves seen so far: tells a reader whether a save came meanwhile
        self._condition = threading.Condition()
        self._watching: tuple[Watched, ...] = ()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def watch(self, paths: tuple[Watched, ...]) -> None:
        """Watch ``paths`` from now on (the threads restart only when they differ from the current ones)."""
        if paths == self._watching:
            return
        self._close_threads()
        self._stop = threading.Event()
        self._watching = paths
        self._threads = [
            threading.Thread(target=self._gather, args=(watched, self._stop), name="dlm-watch", daemon=True)
            for watched in paths
        ]
        for thread in self._threads:
            thread.start()

    def arrived(self) -> int:
        """Block until a save is pending (none taken by :meth:`settled` yet); the number of batches of
        saves seen so far, which :meth:`since` compares with. Ctrl-C and SIGTERM raise here."""
        with self._condition:
            while not self._changed:
                self._condition.wait(1.0)
            return self._batches

    def since(self, batches: int) -> bool:
        """Whether a save came after :meth:`arrived` returned ``batches``."""
        with self._condition:
            return self._batches != batches

    def settled(self, quiet_s: float) -> tuple[str, ...]:
        """The paths saved since the last call, once a save came and then none for ``quiet_s`` seconds.

        Blocks until then; Ctrl-C and SIGTERM raise here as anywhere else.
        """
        with self._condition:
            while not self._changed:
                self._condition.wait(1.0)
            while (left := self._last + quiet_s - time.monotonic()) > 0:
                self._condition.wait(left)
            changed = tuple(self._changed)
            self._changed.clear()
            return changed

    def _gather(self, watched: Watched, stop: threading.Event) -> None:
        from watchfiles import Change, DefaultFilter, watch

        default = DefaultFilter()

        def wanted(change: Any, path: str) -> bool:
            if not default(change, path):
                return False
            # A folder made under a watched tree may hold files written before its own watch began
            # (mkdir, then a file at once): they are looked for when it is reported (_saved_under).
            if watched.recursive and change == Change.added and os.path.isdir(path):
                return True
            return counts(path, watched, self._home)

        try:
            self._gather_changes(watched, stop, wanted, watch)
        except Exception as exc:  # a folder gone or unreadable: say so; the others keep watching
            _log.warning("stopped watching %s: %s", watched.root, exc)

    def _gather_changes(self, watched: Watched, stop: threading.Event, wanted: Any, watch: Any) -> None:
        for changes in watch(
            watched.root, watch_filter=wanted, debounce=_STEP_MS, step=_STEP_MS, stop_event=stop,
            rust_timeout=0, raise_interrupt=False, force_polling=self._force_polling,
            recursive=watched.recursive, ignore_permission_denied=True,
        ):  # fmt: skip
            saved = [found for _, path in changes for found in self._saved_under(path, watched)]
            if not saved:
                continue
            with self._condition:
                for path in saved:
                    self._changed[path] = None
                self._last = time.monotonic()
                self._batches += 1
                self._condition.notify_all()

    def _saved_under(self, path: str, watched: Watched) -> list[str]:
        """``path``, or for a folder just made, the files in it that count as saves."""
        if not os.path.isdir(path):
            return [str(Path(path))]
        found: list[str] = []
        for folder, _, names in os.walk(path):
            found.extend(
                str(Path(folder) / name)
                for name in sorted(names)
                if counts(os.path.join(folder, name), watched, self._home)
            )
        return found

    def _close_threads(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def __enter__(self) -> Saves:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_threads()


__all__ = ["Saves", "Watched", "counts", "watched_paths"]
