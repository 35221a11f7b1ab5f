"""What a train run replays: the draw made before it trains, its rows read back, recorded with the run.

:func:`plan` is called once the run knows the rows it trains from the
document (after the validation split and ``training.dedup``'s drops). It
decides:

* **the generation** the run will have: the latest generation when the run
  trains that generation's rows again (an unchanged document), else the
  next one (:mod:`dlmstore.replay.history`);
* **the rows new** in it: the trained rows history does not hold; for a run
  that joins the latest generation, the rows that generation brought in
  first, so a retrain of an unchanged document sizes its draw exactly as
  the run that opened the generation did;
* **the candidates** (:mod:`dlmstore.replay.candidates`) and **the draw**
  (:mod:`dlmstore.replay.draw`), for each phase the run trains;
* and reads the drawn rows' content back from history, checked against its
  checksum: a damaged row stops the run with one line naming it and what
  to do (``dlm cache verify --repair``), never trains silently.

An unchanged document whose history holds nothing older (the common
retrain) costs one query: no candidate is looked for, and ``current`` (the
document's rows described for history) is never called.

A drawn row trains in the run's train split only (never in val); its
``last_generation`` is not moved by it (that is the latest generation whose
document held it), so the same document trained again draws the same rows.
:func:`record` writes the draw in the run's publish transaction, beside
its history and adapters.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlmstore.document.rows import Row
from dlmstore.errors import TrainingError
from dlmstore.replay.history import KEYS, KINDS, DamagedContent, digest, keys_params, rows_sha256

if TYPE_CHECKING:
    from dlmstore.document.frontmatter import ReplaySettings
    from dlmstore.replay.candidates import Current

#: ``replay_runs.skipped``: why a run did not replay.
NO_REPLAY = "--no-replay"

#: The ``section_id`` of a row read back from history (it belongs to no section of the document).
REPLAY_SECTION = "replay"

PHASES = ("sft", "preference")

#: The most rows of the retention slice a run evaluates (the first by key: the same rows every run).
RETENTION_ROWS = 256

#: The most probes of earlier versions a run asks, beside the document's own.
RETAINED_PROBES = 16


@dataclass(frozen=True)
class DrawnRow:
    """A history row the run replays.

    Attributes:
        row: the row, its data read back from history (checked).
        phase: ``sft`` or ``preference``.
        weight: its weight in the draw.
        last_generation: the latest generation whose document held it.
    """

    row: Row
    phase: str
    weight: float
    last_generation: int


@dataclass(frozen=True)
class RetainedProbe:
    """A ``### Q !probe`` pair an earlier version held and the document no longer holds."""

    row_key: str
    question: str
    reference: str


@dataclass(frozen=True)
class ReplayPlan:
    """What a run replays, and what it was drawn from.

    Attributes:
        generation: the generation the run will have.
        sft_candidates, preference_candidates: history rows each phase could replay.
        sft_new, preference_new: the rows new in the run (what the draw is sized by).
        drawn: the rows replayed: SFT rows then preference triples, each in ``row_key`` order.
        skipped: why the run does not replay (``--no-replay``); None when it drew.
        retention: the frozen retention slice's rows the document no longer holds
            (never drawn): the run measures its adapters' loss on them.
        retained_probes: the probes of earlier versions the document no longer holds.
    """

    generation: int
    sft_candidates: int = 0
    preference_candidates: int = 0
    sft_new: int = 0
    preference_new: int = 0
    drawn: tuple[DrawnRow, ...] = ()
    skipped: str | None = None
    retention: tuple[Row, ...] = ()
    retained_probes: tuple[RetainedProbe, ...] = ()

    def rows(self, phase: str) -> list[Row]:
        """The rows replayed in ``phase``."""
        return [item.row for item in self.drawn if item.phase == phase]

    @property
    def draw_sha256(self) -> str:
        """The draw's identity: the generation, then each phase's drawn keys."""
        text = "\n".join(
            [f"generation {self.generation}"] + [f"{item.phase} {item.row.row_key}" for item in self.drawn]
        )
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    def lock_record(self) -> dict[str, object] | None:
        """What ``dlm.lock`` records of the draw (None when nothing was drawn)."""
        if not self.drawn:
            return None
        rows = len(self.rows("sft"))
        return {
            "generation": self.generation,
            "draw_sha256": self.draw_sha256,
            "rows": rows,
            "triples": len(self.drawn) - rows,
        }

    def describe(self) -> str:
        """One line for ``dlm train``'s output."""
        from dlmstore.plural import plural

        if self.skipped is not None:
            return f"replay: off ({self.skipped}); {plural(self.sft_candidates + self.preference_candidates, 'candidate')} left out"
        sft, preference = self.rows("sft"), self.rows("preference")
        parts = [f"{plural(len(sft), 'row')} of {self.sft_candidates}"]
        if self.preference_candidates:
            parts.append(f"{plural(len(preference), 'preference triple')} of {self.preference_candidates}")
        return f"replay: {' and '.join(parts)} drawn from history (generation {self.generation})"


def generation_of(conn: sqlite3.Connection, trained: Sequence[str]) -> tuple[int, bool]:
    """The generation a run that trains ``trained`` (in that order) will have, and whether it joins it."""
    latest = conn.execute(
        "SELECT generation, rows_sha256 FROM history_generations ORDER BY generation DESC LIMIT 1"
    ).fetchone()
    if latest is None:
        return 1, False
    if latest[1] == rows_sha256(trained):
        return int(latest[0]), True
    return int(latest[0]) + 1, False


def plan(
    conn: sqlite3.Connection,
    *,
    trained: Sequence[str],
    preference_keys: Collection[str],
    current: Callable[[], Current],
    settings: ReplaySettings,
    seed: int,
    phases: Collection[str],
    skipped: str | None = None,
) -> ReplayPlan:
    """The replay of a run that trains the document's rows ``trained`` in ``phases``.

    Args:
        conn: a connection to the store (read only).
        trained: the document's row keys the run trains, in the order
            history records them (SFT rows and preference triples).
        preference_keys: which of them are preference triples.
        current: the document's rows as the candidates need them (all of
            them, val and dropped rows too); called only when history holds
            rows the document might not.
        settings: ``training.replay``.
        seed: the run's seed.
        phases: the phases the run trains (``sft``, ``preference``).
        skipped: why the run does not replay; the candidates are still counted.

    Raises:
        TrainingError: a drawn row's content is damaged in store.db.
    """
    from dlmstore.replay.candidates import candidate_pool
    from dlmstore.replay.draw import draw, size, weight

    generation, joins = generation_of(conn, trained)
    if (
        joins
        and not conn.execute(
            "SELECT EXISTS (SELECT 1 FROM history_rows WHERE last_generation < ?)", (generation,)
        ).fetchone()[0]
    ):
        # Every history row is a row of this generation, so the document holds them all.
        return ReplayPlan(generation, skipped=skipped)
    document = current()
    news = _new_counts(conn, trained, preference_keys, generation, joins)
    drawn: list[DrawnRow] = []
    counts = {"sft": 0, "preference": 0}
    for phase in PHASES:
        if phase not in phases:
            continue
        pool = candidate_pool(conn, document, preference=phase == "preference")
        counts[phase] = len(pool)
        if skipped is not None or not len(pool):
            continue
        k = size(news[phase], len(pool), settings, preference=phase == "preference")
        keys = draw(pool, k, generation=generation, seed=seed, floor=settings.weight_floor).row_keys
        drawn.extend(_read_back(conn, keys, phase, generation, settings.weight_floor, weight))
    rows, probes = retention(conn, document)
    return ReplayPlan(
        generation, counts["sft"], counts["preference"], news["sft"], news["preference"], tuple(drawn), skipped,
        rows, probes,
    )  # fmt: skip


def retention(
    conn: sqlite3.Connection, document: Current
) -> tuple[tuple[Row, ...], tuple[RetainedProbe, ...]]:
    """What retention is measured on for ``document``: the retention slice's rows and the ``!probe``
    pairs of earlier versions that it no longer holds (neither superseded), read back and checked.
    ``dlm train`` measures them after each phase (:func:`plan`), ``dlm eval`` on demand.

    Raises:
        TrainingError: a row's content is damaged in store.db.
    """
    return tuple(_retention_rows(conn, document)), tuple(_retained_probes(conn, document))


def _retention_rows(conn: sqlite3.Connection, document: Current) -> list[Row]:
    """The retention slice's SFT rows the document no longer holds (not superseded), by key, at most
    :data:`RETENTION_ROWS`: what the run's retention loss is measured on."""
    from dlmstore.replay.candidates import absent

    keys = absent(conn, document, "retention = 1 AND kind <> 2")[:RETENTION_ROWS]
    return [item.row for item in _read_back(conn, keys, "sft", 0, 1.0, lambda *_: 1.0)]


def _retained_probes(conn: sqlite3.Connection, document: Current) -> list[RetainedProbe]:
    """The ``### Q !probe`` pairs of earlier versions the document no longer holds (not superseded):
    the most recent first, at most :data:`RETAINED_PROBES`."""
    from dlmstore.replay.candidates import absent

    keys = absent(conn, document, "probe = 1 AND kind = 1", order="last_generation DESC, key")
    probes: list[RetainedProbe] = []
    for item in _read_back(conn, keys[:RETAINED_PROBES], "sft", 0, 1.0, lambda *_: 1.0):
        messages = item.row.data["messages"]
        question = next((m["content"] for m in messages if m["role"] == "user"), None)
        answer = next((m["content"] for m in messages if m["role"] == "assistant"), None)
        if question is not None and answer is not None:
            probes.append(RetainedProbe(item.row.row_key, question, answer))
    return probes


def _new_counts(
    conn: sqlite3.Connection,
    trained: Sequence[str],
    preference_keys: Collection[str],
    generation: int,
    joins: bool,
) -> dict[str, int]:
    """The SFT rows and preference triples new in the run (see the module docstring)."""
    if joins:
        found = dict(
            conn.execute(
                "SELECT kind = 2, count(*) FROM history_rows WHERE first_generation = ? GROUP BY kind = 2",
                (generation,),
            ).fetchall()
        )
        return {"sft": int(found.get(0, 0)), "preference": int(found.get(1, 0))}
    held = {
        bytes(row[0])
        for row in conn.execute(f"SELECT key FROM history_rows WHERE key IN ({KEYS})", keys_params(trained))
    }
    news = {"sft": 0, "preference": 0}
    for key in trained:
        if digest(key) not in held:
            news["preference" if key in preference_keys else "sft"] += 1
    return news


def _read_back(
    conn: sqlite3.Connection,
    keys: Sequence[str],
    phase: str,
    generation: int,
    floor: float,
    weight: Callable[[int, int, float], float],
) -> list[DrawnRow]:
    """The drawn rows with their content, checked, in ``keys``' order."""
    from dlmstore.replay.history import decode, row_key_of

    found: dict[str, DrawnRow] = {}
    query = (
        "SELECT h.key, h.kind, h.last_generation, h.checksum, c.content FROM history_rows AS h "
        f"LEFT JOIN history_content AS c ON c.id = h.content_id WHERE h.key IN ({KEYS})"
    )
    for key, kind, last, checksum, content in conn.execute(query, keys_params(keys)):
        row_key = row_key_of(key)
        try:
            if content is None:
                raise DamagedContent("has no content")
            stored_kind, data = decode(key, content, checksum)
        except DamagedContent as exc:
            raise TrainingError(
                f"replay history row {row_key} is damaged in store.db: {exc}",
                hint="run `dlm cache verify --repair DOC` to remove it, then run this command again",
            ) from None
        if stored_kind != KINDS[kind]:
            raise TrainingError(
                f"replay history row {row_key} is damaged in store.db: its content is a {stored_kind} row, "
                f"recorded {KINDS[kind]}",
                hint="run `dlm cache verify --repair DOC` to remove it, then run this command again",
            )
        row = Row(row_key, REPLAY_SECTION, 0, stored_kind, data)
        found[row_key] = DrawnRow(row, phase, weight(last, generation, floor), int(last))
    return [found[key] for key in keys]


def record(conn: sqlite3.Connection, run_id: int, replay: ReplayPlan) -> None:
    """Record what run ``run_id`` replayed, inside its publish transaction."""
    sft = sum(item.phase == "sft" for item in replay.drawn)
    conn.execute(
        "INSERT INTO replay_runs (run_id, generation, sft_candidates, preference_candidates, sft_new, "
        "preference_new, sft_drawn, preference_drawn, draw_sha256, skipped) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run_id, replay.generation, replay.sft_candidates, replay.preference_candidates, replay.sft_new,
            replay.preference_new, sft, len(replay.drawn) - sft, replay.draw_sha256, replay.skipped,
        ),
    )  # fmt: skip
    conn.executemany(
        "INSERT INTO replay_draws (run_id, key, phase, weight, last_generation) VALUES (?, ?, ?, ?, ?)",
        [
            (run_id, digest(item.row.row_key), item.phase, item.weight, item.last_generation)
            for item in replay.drawn
        ],
    )
