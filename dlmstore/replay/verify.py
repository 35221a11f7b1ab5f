"""``dlm cache verify`` with the replay history checked too.

The cache's checks (:func:`dlmstore.cache.admin.verify`) sit below the
replay history in the layers, so this module composes them: it runs them,
then decodes every history row's stored content against its checksum
(a CRC-32 of the key digest and the content;
:func:`dlmstore.replay.history.damaged`). A row whose content does not
decompress or does not match is a ``damaged_history_row``;
``--repair`` removes it (history never trains on content it cannot trust).
A damaged store.db is reported alone, as the cache's verify reports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dlmstore.cache.admin import VerifyResult
    from dlmstore.store.database import Store


def verify(store: Store, *, repair: bool = False) -> VerifyResult:
    """The cache's verify of ``store``, plus one ``damaged_history_row`` problem per damaged history row."""
    from dlmstore.cache.admin import Problem, VerifyResult
    from dlmstore.cache.admin import verify as verify_cache
    from dlmstore.replay.history import damaged, delete

    result = verify_cache(store, repair=repair)
    if any(problem.kind == "damaged_database" for problem in result.problems):
        return result
    with store.read() as conn:
        found = damaged(conn)
    if repair and found:
        with store.write() as conn:
            delete(conn, [key for key, _ in found])
    problems = [
        *result.problems,
        *(
            Problem("damaged_history_row", "history_content", f"history row {key}: {detail}", repair)
            for key, detail in found
        ),
    ]
    return VerifyResult(result.entries_checked, result.segments_checked, problems, result.store_in_use)
