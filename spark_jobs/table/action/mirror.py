"""``bucketindex mirror TABLE --enable delta|iceberg``: turn a projection on as a timeline action.

A projection is a property of the snapshot, like its schema: it is set by one ``commit``
instant with ``operation: "set_properties"`` whose metadata records ``properties: {"mirrors":
[...]}`` (the full list, so an entry can be read alone) and no file group, written through the
commit protocol (:class:`~.transaction.Transaction`). Writers learn it from the snapshot they
commit on, so a writer that opened the table before the change still mirrors once the property
is on the timeline (its post-commit hook reads the properties after its own entry), and the
change survives archival in checkpoints (``FileSystemView.to_state``). ``table.json`` stays
immutable (format.md §3.1): it only holds what creation fixed (``--mirror delta``).

The commit's own post-commit hook (:mod:`spark_jobs.table.projection`) writes every version of
the projection so far (the gap from version 0: a Delta log, §11, or Iceberg metadata, §12),
so enabling costs one sequence entry plus the history's projection. Enabling twice, or
concurrently, is harmless: the second entry records the same list. No JVM, no ``pyspark``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from spark_jobs.exceptions import BadInputError
from spark_jobs.table import delta, projection
from spark_jobs.table.action.options import POSITIONAL, SWITCH, VerbOptions, check_choice, option
from spark_jobs.table.action.transaction import Transaction
from spark_jobs.table.commit import NO_ROWS_CHANGED, Written
from spark_jobs.table.config import MIRRORS
from spark_jobs.table.timeline import Action
from spark_jobs.table.view import FileSystemView

__all__ = ["MirrorOptions", "OPERATION", "enable_mirror"]

log = logging.getLogger("bucketindex.mirror")


@dataclass(frozen=True, kw_only=True)
class MirrorOptions(VerbOptions):
    """The options of ``bucketindex mirror``: turn a projection on, or repair its log; exactly one."""

    VERB = "mirror"

    table: str = option(form=POSITIONAL)
    #: the projection to turn on (``delta`` or ``iceberg``)
    enable: str | None = option("--enable", default=None)
    #: check every version against the timeline, write missing ones, rewrite damaged ones
    repair: bool = option("--repair", form=SWITCH, default=False)

    def __post_init__(self) -> None:
        check_choice("--enable", self.enable, MIRRORS)
        if (self.enable is None) == (not self.repair):
            raise BadInputError("mirror takes one of --enable delta|iceberg and --repair")

#: the ``operation`` of the commit that sets table properties
OPERATION = "set_properties"


def enable_mirror(table_uri: str, mirror: str, *, max_retries: int = 3,
                  heartbeat_timeout_s: float | None = None) -> dict[str, Any]:
    """Turn projection ``mirror`` on for the table at ``table_uri`` and write every version so
    far; nothing is committed when the table already asks for it (then only missing versions
    are written, as ``--repair`` does).

    Bad input (an unknown projection, no table, a schema the projection cannot hold exactly,
    pyiceberg missing for ``iceberg``) raises BadInputError before anything is written."""
    from spark_jobs.table.table import Table

    if mirror not in MIRRORS:
        raise BadInputError(f"unknown mirror {mirror!r}; expected one of {', '.join(MIRRORS)}")
    table = Table.open(table_uri)
    view = table.view() if table.config is not None else None
    if table.config is None or view is None or view.schema is None:
        raise BadInputError(f"no table at {table_uri}: a projection is turned on for an existing table "
                            f"(create one with `bucketindex upsert ... --mirror {mirror}`)")
    if mirror == "iceberg":
        from spark_jobs.table import iceberg

        iceberg.require()
        iceberg.check_supported(table, view.schema)
        iceberg.check_files(table, view)
    instant = None
    if mirror not in delta.mirrors(table, view.properties):
        index_type = table.config.index_type
        txn = Transaction(table, Action.COMMIT, {"operation": OPERATION}, view=view, repair=True,
                          heartbeat_timeout_s=heartbeat_timeout_s)

        def attempt(view: FileSystemView, retries: list[dict[str, Any]]) -> Written:
            listed = sorted({*(view.properties.get("mirrors") or ()), mirror})
            return Written(operation=OPERATION, index_type=index_type, properties={"mirrors": listed},
                           file_groups=(), index_added=(), index_removed=(), counts=NO_ROWS_CHANGED)

        txn.run(attempt, max_retries=max_retries, what="mirror --enable")
        instant = txn.ts
        log.info("committed %s: the %s projection is on", instant, mirror)
    # the hook wrote the history; this fills what a failed hook left
    written = projection.module(mirror).repair(table)
    return {"enabled": mirror, "instant": instant, "written": written, "version": table.timeline.last_seq}
