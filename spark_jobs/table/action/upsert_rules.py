"""The upsert's rules, written once: which row of a key wins, which rows move, where each row
is routed, what is decided without writing, how the tag phase counts (issue 37, "rules once").

Both engines (:mod:`spark_jobs.jobs.upsert` on DataFrames, :mod:`spark_jobs.arrow_engine.upsert`
on Arrow tables) call these functions; neither states a rule of its own. As compaction's
``Write``/``Pick`` seam (:mod:`spark_jobs.table.action.compact`) lets the action decide and an
engine execute, a rule here is written against :class:`Ops`, the few column primitives an engine
supplies (a Spark ``Column`` expression or a pyarrow compute call over one table), so the same
function yields a native Spark expression -- no Python per row on the cluster -- and an Arrow
mask in-process:

* :func:`exists`, :func:`moved`, :func:`entering`, :func:`absent_delete`, :func:`stale_move`
  -- the row predicates of the tag and route phases;
* :data:`TAG_STATS` -- what the tag phase counts per partition (the plan for entering rows
  takes its ``entering`` counts);
* :func:`routes` -- the streams a tagged batch is split into (in place, moving out, entering;
  the bucket index's one stream by hash), each with its filter, operation, target and FOUND;
* :data:`DECIDED` -- the columns of a row decided without writing (``action.read_set``);
* :func:`identity_columns`, :func:`dedupe_winners` -- the dedupe's identity and its winner
  (highest precombine value in format.md §8's order, then the greatest source row);
* :func:`legacy_aliases`, :func:`mover_slices`, :func:`lacking_columns` -- which directory a
  value keeps, which file slices hold movers, which columns a partial batch's mover fetches;
* :func:`tee_row`, :func:`tee_kind`, :func:`tee_report` -- the tee (``--shadow-index``): per
  key, whether the table's index and the shadow index find it and agree, the disagreement's
  kind, and the commit's ``shadow`` entry.

What stays per engine, and why (the engine primitives):

* the column primitives of :class:`Ops` -- a Spark ``Column`` vs ``pyarrow.compute``; the
  order ``older`` compares in is format.md §8's on both (Spark's SQL ``>`` already puts NaN
  highest and -0.0 equal to 0.0; Arrow ranks with :func:`spark_jobs.table.ordering.older`);
* filtering, adding columns and the union of the route's streams (a lazy DataFrame plan vs
  eager tables);
* the dedupe's execution: on Spark the batch is hash-partitioned by identity once (no sort),
  cached, and each identity's rows counted over the cache; only a batch whose keys repeat runs
  ``max_by`` over the order :func:`dedupe_order` names, within the cached partitions (one sort,
  no second shuffle; running Python per row would cost minutes); Arrow's
  :func:`dedupe_winners` over numpy codes;
* the joins with the snapshot -- the key lookup (index buckets or the key scan), the read of
  the movers' stored rows, the tee's key scan -- a shuffle or broadcast join on Spark,
  ``index_in`` or a hash join in-process; and the tee's per-key aggregation (``max`` vs ``any``);
* the file-group slot ``pmod(xxhash64(key, FILE_GROUP_SALT), n)`` (Spark's native hash,
  ``arrow_engine.keys.file_group_slots`` bit for bit) and the lookup of a slot in the plan's
  ranges (a range join vs ``searchsorted``); the plan itself is
  :func:`spark_jobs.table.action.upsert.plan_new_file_groups`.

This module imports no engine (it is part of the table core's action layer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.exceptions import EngineUnsupportedError
from spark_jobs.table.action.upsert import DEL, DELETE, KEY, MOVE_IN, MOVE_OUT, OLD_FID, OLD_PART, PART, UPSERT
from spark_jobs.table.config import INDEX_BUCKET, TableConfig
from spark_jobs.table.layout import legacy_partition_aliases
from spark_jobs.table.ordering import ranks, sort_key

if TYPE_CHECKING:
    from spark_jobs.table.view import FileSlice, FileSystemView

__all__ = [
    "DECIDED", "MOVED", "NEW", "OLD", "BY_HASH", "TAG_STATS", "Ops", "Route",
    "absent_delete", "dedupe_order", "dedupe_winners", "entering", "entering_counts", "exists",
    "identity_columns", "lacking_columns", "legacy_aliases", "any_moved", "moved", "mover_slices",
    "routes", "stale_move", "tee_compared", "tee_identity", "tee_kind", "tee_report", "tee_row",
]

#: a tagged batch's column holding :func:`moved` once computed (a stale move drop reads it)
MOVED = "_bi_moved"

X = TypeVar("X")


class Ops(Protocol[X]):
    """The column primitives an engine supplies to evaluate a rule over one batch: ``X`` is a
    Spark ``Column`` or an Arrow array. Null handling is the rule's: ``differ``, ``same`` and
    ``is_true`` read null as false, so no rule depends on an engine's three-valued logic."""

    def col(self, name: str) -> X: ...
    def lit(self, value: Any) -> X: ...
    def valid(self, x: X) -> X: ...
    def and_(self, a: X, b: X) -> X: ...
    def or_(self, a: X, b: X) -> X: ...
    def not_(self, a: X) -> X: ...
    def differ(self, a: X, b: X) -> X: ...
    def same(self, a: X, b: X) -> X: ...
    def if_else(self, cond: X, a: X, b: X) -> X: ...
    def older(self, incoming: X, stored: X) -> X: ...
    def is_true(self, x: X) -> X: ...


# -- the row predicates --------------------------------------------------------------------
def exists(o: Ops[X]) -> X:
    """The key is in the snapshot (the tag phase found its file group)."""
    return o.valid(o.col(OLD_FID))


def moved(o: Ops[X]) -> X:
    """An upsert of a known key whose partition value changed (global indexes): it leaves its
    old file group and enters one of its new partition."""
    return o.and_(o.and_(exists(o), o.not_(o.col(DEL))), o.differ(o.col(OLD_PART), o.col(PART)))


def entering(o: Ops[X]) -> X:
    """Rows that need a file group in their partition: new keys and keys moving in."""
    return o.or_(moved(o), o.and_(o.not_(exists(o)), o.not_(o.col(DEL))))


def absent_delete(o: Ops[X]) -> X:
    """A delete of a key the snapshot does not hold: decided without writing."""
    return o.and_(o.not_(exists(o)), o.col(DEL))


def stale_move(o: Ops[X], *, precombine: str, stored: X) -> X:
    """A mover (:data:`MOVED`) whose stored row orders above it: dropped, decided without writing
    (the stored row stays where it is; format.md §8's "not lower" rule)."""
    return o.is_true(o.and_(o.and_(o.col(MOVED), o.valid(stored)), o.older(o.col(precombine), stored)))


#: what the tag phase counts per partition: keys found, keys moving in, rows entering
TAG_STATS: tuple[tuple[str, Callable[[Ops[Any]], Any]], ...] = (
    ("found", exists), ("moved", moved), ("entering", entering))


def any_moved(stats: dict[str, dict[str, int]]) -> bool:
    return any(s["moved"] for s in stats.values())


def entering_counts(stats: dict[str, dict[str, int]]) -> dict[str, int]:
    """Rows entering each partition that has any: the file-group plan's input."""
    return {p: s["entering"] for p, s in stats.items() if s["entering"]}


# -- routing -------------------------------------------------------------------------------
#: where a stream's rows go: the file group holding the key, a planned group of its partition,
#: or the bucket index's group ``hash(key) mod N`` of its partition
OLD, NEW, BY_HASH = "old", "new", "by_hash"


@dataclass(frozen=True)
class Route(Generic[X]):
    """One stream of routed rows: which rows (``where``), the operation the merge applies
    (``op``), where they go (``target``) and what FOUND says (None: not looked up)."""

    name: str
    where: Callable[[Ops[Any]], Any]
    op: Callable[[Ops[Any]], Any]
    target: str
    found: bool | None


def _delete_or_upsert(o: Ops[X]) -> X:
    return o.if_else(o.col(DEL), o.lit(DELETE), o.lit(UPSERT))


def routes(index_type: str) -> tuple[Route[Any], ...]:
    """The streams a tagged batch is routed in, in output order. Global indexes: a known key
    stays in its group (deleted or upserted), a mover leaves it (``move_out``) and enters a
    planned group of its new partition (``move_in``) with the new keys; deletes of absent keys
    and stale movers are in no stream (:data:`DECIDED`). The bucket index routes every row by
    hash; its merges decide what each row does. The ``old``/``new`` streams read :data:`MOVED`."""
    if index_type == INDEX_BUCKET:
        return (Route("by_hash", where=lambda o: o.lit(True), op=_delete_or_upsert, target=BY_HASH, found=None),)
    return (
        Route("in_place", where=lambda o: o.and_(exists(o), o.not_(o.col(MOVED))), op=_delete_or_upsert,
              target=OLD, found=True),
        Route("move_out", where=lambda o: o.col(MOVED), op=lambda o: o.lit(MOVE_OUT), target=OLD, found=True),
        Route("entering", where=lambda o: o.or_(o.col(MOVED), o.and_(o.not_(exists(o)), o.not_(o.col(DEL)))),
              op=lambda o: o.if_else(o.col(MOVED), o.lit(MOVE_IN), o.lit(UPSERT)), target=NEW, found=False),
    )


#: a row decided without writing, as ``action.read_set`` takes it: (output column, tagged column)
#: -- the group holding the stored row, or nulls for a key the snapshot does not hold
DECIDED: tuple[tuple[str, str], ...] = (("key", KEY), ("part", OLD_PART), ("fid", OLD_FID))


# -- dedupe --------------------------------------------------------------------------------
def identity_columns(cfg: TableConfig) -> list[str]:
    """What one winner is chosen per: the key (global indexes), (partition, key) for the bucket
    index, whose identity is per partition."""
    return [PART, KEY] if cfg.index_type == INDEX_BUCKET else [KEY]


def dedupe_order(cfg: TableConfig, source_columns: list[str]) -> tuple[list[str], list[str]]:
    """What the winner of an identity is the greatest in, in turn: the precombine value
    (format.md §8's order; none without a precombine field), then the whole source row -- its
    ``source_columns`` compared one by one -- so ties never depend on file or task order."""
    return ([cfg.precombine_field] if cfg.precombine_field else []), list(source_columns)


def dedupe_winners(identity: pa.Array | pa.ChunkedArray, precombine: pa.Array | pa.ChunkedArray | None,
                   order_cols: list[Any], has_map: bool) -> np.ndarray:
    """Row positions of the winner of each identity, in row order (:func:`dedupe_order`: highest
    precombine value in format.md §8's order -- nulls lowest, NaN highest, -0.0 equal to 0.0;
    then the greatest source row compared column by column as Spark orders structs). Identities
    seen once need no comparison. A tie in a row holding a map is refused with
    :class:`EngineUnsupportedError`: Spark compares such rows by their JSON text."""
    if isinstance(identity, pa.ChunkedArray):
        identity = identity.combine_chunks()
    codes = pc.dictionary_encode(identity).indices.to_numpy(zero_copy_only=False)
    counts = np.bincount(codes)
    if counts.size == 0 or counts.max() <= 1:
        return np.arange(len(codes))
    dup_rows = np.nonzero(counts[codes] > 1)[0]
    # the precombine values as their ranks in format.md §8's order (the staleness check and the
    # read-time merge rank by the same function); the rows a tie compares by their sort keys
    pre_rank = ranks(precombine.take(pa.array(dup_rows))).tolist() if precombine is not None else None
    rows = [c.take(pa.array(dup_rows)).to_pylist() for c in order_cols]
    best: dict[int, tuple[Any, int]] = {}
    for j, r in enumerate(dup_rows.tolist()):
        code = int(codes[r])
        order = (pre_rank[j] if pre_rank is not None else (), )
        prev = best.get(code)
        if prev is not None:
            if order < prev[0]:
                continue
            if order == prev[0]:
                if has_map:
                    raise EngineUnsupportedError("rows of one key tie on the precombine field in a table with map "
                                                 "columns (Spark compares such rows by their JSON text)")
                mine = tuple(sort_key(col[j]) for col in rows)
                theirs = tuple(sort_key(col[prev[1]]) for col in rows)
                if mine <= theirs:
                    continue
        best[code] = (order, j)
    winners = [int(dup_rows[j]) for _, j in best.values()]
    keep = np.nonzero(counts[codes] == 1)[0]
    return np.sort(np.concatenate([keep, np.asarray(winners, dtype=np.int64)]))


# -- the snapshot's side -------------------------------------------------------------------
def legacy_aliases(cfg: TableConfig, view: "FileSystemView | None") -> dict[str, str]:
    """``{directory a value gets now: directory the table already holds it in}``: a value an
    older table named by the older rule (format.md §1) stays in that directory, so a
    bucket-index key is found where it is stored. Applied after the dedupe: old and new names
    are one-to-one, so identities stay distinct. Empty: nothing to rename."""
    if view is None or not cfg.partition_fields:
        return {}
    return legacy_partition_aliases(field=cfg.partition_fields[0], partitions={p for p, _ in view.file_groups})


def mover_slices(view: "FileSystemView", holders: set[tuple[str, str]]) -> list["FileSlice"]:
    """The file slices holding the stored rows of movers (``holders``: their (partition, file
    id)), in a fixed order: only these are read to drop stale moves or fetch a partial row."""
    return [view.file_groups[h] for h in sorted(holders) if h in view.file_groups]


def lacking_columns(view: "FileSystemView", carried: list[str]) -> list[str]:
    """A ``--partial-update`` batch's mover takes these columns' stored values from its old file
    group, so the row entering its new partition is whole (format.md §8)."""
    assert view.schema is not None
    return [n for n in view.schema.names if n != KEY and n not in carried]


# -- the tee (``--shadow-index``, format.md §3.3) ------------------------------------------
#: a tee's per-row and per-key columns: the table's index finds the key (TEE_OWN), the shadow
#: index finds it (TEE_SH), the two agree on where (TEE_SAME); the shadow's answer (SH_PART, SH_FID)
TEE_OWN, TEE_SH, TEE_SAME = "_bi_tee_own", "_bi_tee_sh", "_bi_tee_same"
SH_PART, SH_FID = "_bi_sh_part", "_bi_sh_fid"
#: a key both indexes agree on (no kind)
AGREE = ""


def tee_compared(index_type: str, shadow_index: str) -> str:
    """What the tee compares: a bucket table's file group; partitions only against a shadow
    bucket index (its file groups are hash buckets, a record table's are not); else both."""
    return "file_group" if index_type == INDEX_BUCKET else "partition" if shadow_index == INDEX_BUCKET else "location"


def tee_identity(index_type: str) -> list[str]:
    """The tee compares per identity: (partition, key) on a bucket table, the key otherwise."""
    return [PART, KEY] if index_type == INDEX_BUCKET else [KEY]


def tee_row(o: Ops[X], *, index_type: str, shadow_index: str) -> tuple[X, X, X]:
    """Per row of the batch joined with the snapshot's key scan (SH_PART, SH_FID; the table's
    answer in OLD_PART, OLD_FID): whether the table's index finds the key, whether the shadow
    does, and whether they agree. A bucket table's identity is per partition: only the key's
    stored rows in the row's partition count."""
    own = o.valid(o.col(OLD_FID))
    if index_type == INDEX_BUCKET:
        here = o.same(o.col(SH_PART), o.col(PART))
        return own, o.and_(here, o.valid(o.col(SH_FID))), o.and_(here, o.same(o.col(SH_FID), o.col(OLD_FID)))
    same = o.same(o.col(SH_PART), o.col(OLD_PART))
    if shadow_index != INDEX_BUCKET:
        same = o.and_(same, o.same(o.col(SH_FID), o.col(OLD_FID)))
    return own, o.valid(o.col(SH_FID)), same


def tee_kind(o: Ops[X], *, index_type: str) -> X:
    """Per key (TEE_OWN, TEE_SH, TEE_SAME: any of its rows), the disagreement in shadow-compare's
    words, :data:`AGREE` for none: *missing* -- the shadow finds it, the table's index does not;
    *extra* -- the reverse; *wrong_location* -- both, in different places. A bucket index answers
    every key, so a bucket table only has wrong locations."""
    own, sh, same = o.col(TEE_OWN), o.col(TEE_SH), o.col(TEE_SAME)
    if index_type == INDEX_BUCKET:
        return o.if_else(o.and_(sh, o.not_(same)), o.lit("wrong_location"), o.lit(AGREE))
    wrong = o.if_else(o.and_(o.and_(own, sh), o.not_(same)), o.lit("wrong_location"), o.lit(AGREE))
    return o.if_else(o.and_(o.not_(own), sh), o.lit("missing"),
                     o.if_else(o.and_(own, o.not_(sh)), o.lit("extra"), wrong))


def tee_report(*, shadow_index: str, index_type: str, keys_compared: int,
               found: dict[str, tuple[int, list[str]]], kinds: tuple[str, ...], samples: int) -> dict[str, Any]:
    """The commit's ``shadow`` entry from each kind's (count, sorted keys' first ``samples``)."""
    return {"shadow_index": shadow_index, "keys_compared": keys_compared,
            "compared": tee_compared(index_type, shadow_index),
            "disagreements": {k: int(found[k][0]) if k in found else 0 for k in kinds},
            "samples": {k: list(found[k][1])[:samples] if k in found else [] for k in kinds}}
