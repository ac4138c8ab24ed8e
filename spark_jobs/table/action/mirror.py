"""``bucketindex mirror TABLE --enable delta|iceberg [--view fresh|read_optimized]``: turn a
projection on (or change the view of a merge-on-read table it publishes) as a timeline action.

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

**The view** (``--view``, merge-on-read tables; format.md §12): ``read_optimized`` (the default:
bases as of each file group's last compaction) or ``fresh`` (every commit's rows, each log an
added data file and the rows the merge drops position-delete files in Iceberg, inline deletion
vectors in Delta -- Delta's only for a table whose paths Polars reads right,
``delta.fresh_view_refusal``, format.md §11). It is the
timeline property ``mirror_views`` (``{"iceberg": "fresh"}``), set by the same kind of entry,
and it is the view of **every** version: changing it rewrites the projection's history (the
entry's own hook finds the previous version in the other view and rewrites the chain from
version 0, as ``mirror --repair`` would), so time travel never switches views mid-history.
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
    #: with ``--enable``: the view of a merge-on-read table it publishes (``read_optimized``, the
    #: default, or ``fresh``: Iceberg, and Delta for tables ``delta.fresh_view_refusal`` accepts);
    #: None keeps the table's
    view: str | None = option("--view", default=None)
    #: check every version against the timeline, write missing ones, rewrite damaged ones
    repair: bool = option("--repair", form=SWITCH, default=False)

    def __post_init__(self) -> None:
        check_choice("--enable", self.enable, MIRRORS)
        if (self.enable is None) == (not self.repair):
            raise BadInputError("mirror takes one of --enable delta|iceberg and --repair")
        check_view(self.enable, self.view)


def check_view(mirror: str | None, view: str | None) -> None:
    """The rule of ``--view``: one of :data:`~spark_jobs.table.delta.VIEWS`, given with ``--enable``.
    Every projection can express ``fresh`` (:data:`~spark_jobs.table.delta.FRESH_VIEW_MIRRORS`);
    Delta's fresh view also depends on the table: :func:`~spark_jobs.table.delta.fresh_view_refusal`,
    checked by :func:`enable_mirror`."""
    check_choice("--view", view, delta.VIEWS)
    if view is not None and mirror is None:
        raise BadInputError("--view goes with --enable (the view a projection publishes)")

#: the ``operation`` of the commit that sets table properties
OPERATION = "set_properties"


def enable_mirror(table_uri: str, mirror: str, *, view: str | None = None, max_retries: int = 3,
                  heartbeat_timeout_s: float | None = None) -> dict[str, Any]:
    """Turn projection ``mirror`` on for the table at ``table_uri`` and write every version so
    far; nothing is committed when the table already asks for it in ``view`` (None: whatever
    view it has; then only missing versions are written, as ``--repair`` does). A new ``view``
    is committed with the list and rewrites every version in it (module docstring).

    Bad input (an unknown projection or view, no table, a schema the projection cannot hold exactly,
    pyiceberg missing for ``iceberg``, a table whose paths Polars would misread with deletion
    vectors for Delta's fresh view) raises BadInputError before anything is written."""
    from spark_jobs.table.table import Table

    if mirror not in MIRRORS:
        raise BadInputError(f"unknown mirror {mirror!r}; expected one of {', '.join(MIRRORS)}")
    check_view(mirror, view)
    table = Table.open(table_uri)
    snap = table.view() if table.config is not None else None
    if table.config is None or snap is None or snap.schema is None:
        raise BadInputError(f"no table at {table_uri}: a projection is turned on for an existing table "
                            f"(create one with `bucketindex upsert ... --mirror {mirror}`)")
    if mirror == "iceberg":
        from spark_jobs.table import iceberg

        iceberg.require()
        iceberg.check_supported(table, snap.schema)
        iceberg.check_files(table, snap)
    if mirror == delta.MIRROR_DELTA and view == delta.VIEW_FRESH:
        refusal = delta.fresh_view_refusal(table, snap)
        if refusal is not None:
            raise BadInputError(refusal)
    instant = None
    if mirror not in delta.mirrors(table, snap.properties) or (
            view is not None and delta.mirror_view(table, mirror, snap.properties) != view):
        index_type = table.config.index_type
        txn = Transaction(table, Action.COMMIT, {"operation": OPERATION}, view=snap, repair=True,
                          heartbeat_timeout_s=heartbeat_timeout_s)

        def attempt(current: FileSystemView, retries: list[dict[str, Any]]) -> Written:
            listed = sorted({*(current.properties.get("mirrors") or ()), mirror})
            props: dict[str, Any] = {"mirrors": listed}
            views = dict(current.properties.get(delta.VIEWS_PROPERTY) or {})
            if view is not None and views.get(mirror, delta.VIEW_READ_OPTIMIZED) != view:
                views[mirror] = view  # the full map, so the entry reads alone; tables that never
                props[delta.VIEWS_PROPERTY] = views  # asked for a view keep their properties' bytes
            return Written(operation=OPERATION, index_type=index_type, properties=props,
                           file_groups=(), index_added=(), index_removed=(), counts=NO_ROWS_CHANGED)

        txn.run(attempt, max_retries=max_retries, what="mirror --enable")
        instant = txn.ts
        log.info("committed %s: the %s projection is on (%s view)", instant, mirror,
                 delta.mirror_view(table, mirror, table.view().properties))
    # the hook wrote the history (in a new view: rewrote it); this fills what a failed hook left
    writer = projection.module(mirror)
    written = writer.verify_and_repair(table).written if view is not None and instant is not None \
        else writer.repair(table)
    return {"enabled": mirror, "view": delta.mirror_view(table, mirror, table.view().properties), "instant": instant,
            "written": written, "version": table.timeline.last_seq}
