"""The post-commit hook of the table's projections (format.md §11 Delta Lake, §12 Iceberg):
one place that every sequence entry's writer calls after its commit point
(:class:`~spark_jobs.table.action.transaction.Transaction` and a rollback's decision).

A projection is derived from the timeline and runs after the commit point, so it never fails
the commit: each one that raises is logged as a warning, the others still run, and the gap is
filled by the next writer or ``bucketindex mirror TABLE --repair``. Only the projections the
table asks for are imported (``pyiceberg`` is loaded by a table with the Iceberg projection only).
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import TYPE_CHECKING, Any

from spark_jobs.io.storage import redact_uri
from spark_jobs.table.config import MIRRORS, table_mirrors
from spark_jobs.table.faults import maybe_crash

if TYPE_CHECKING:
    from spark_jobs.table.table import Table

__all__ = ["after_commit", "module", "NAMES"]

log = logging.getLogger("bucketindex.projection")

#: how each projection is named in messages
NAMES = {"delta": "Delta log", "iceberg": "Iceberg metadata"}


def module(mirror: str) -> ModuleType:
    """The module that writes projection ``mirror`` (``mirror_commit``, ``repair``,
    ``verify_and_repair``, ``versions_present``)."""
    if mirror == "delta":
        from spark_jobs.table import delta

        return delta
    if mirror == "iceberg":
        from spark_jobs.table import iceberg

        return iceberg
    raise ValueError(f"unknown projection {mirror!r}")  # pragma: no cover - MIRRORS is checked at the door


def after_commit(table: "Table", seq: int, *, properties: dict[str, Any],
                 fault_point: str = "after_commit_before_mirror") -> None:
    """Project entry ``seq`` in every projection the table asks for (``properties``: the
    snapshot's after entry ``seq``, so asking costs no request), in :data:`MIRRORS` order.

    ``fault_point`` names the crash point before the first write: a rollback has its own,
    since a writer's repair runs one before the writer's own commit."""
    wanted = [m for m in MIRRORS if m in table_mirrors(table, properties)]
    if not wanted:
        return
    maybe_crash(fault_point)
    for m in wanted:
        try:
            module(m).mirror_commit(table, seq)
        except Exception as e:  # noqa: BLE001 - the commit is done; the projection is derived
            log.warning("the %s of %s was not written for sequence %d (%s); the next commit or "
                        "`bucketindex mirror %s --repair` writes it", NAMES.get(m, m), table.display_uri, seq,
                        redact_uri(str(e)).splitlines()[0] if str(e) else type(e).__name__, table.display_uri,
                        exc_info=True)
