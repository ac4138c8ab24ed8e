"""Merging a merge-on-read file slice: a base file plus its log files, in Arrow alone.

One function serves every reader (Spark's ``mapInArrow`` tasks, the Arrow reader, the
upsert's delete check and data compaction), so they cannot disagree on what a slice holds.

The rules (``docs/format.md`` §5.1), per record key, over the base (position 0) and the
logs (positions 1.. in commit order):

* a *barrier* -- a ``delete`` or ``move_out`` row of a log -- erases every earlier row of
  the key. Writers only log a delete that was effective against the stored row (its
  precombine value checked when it was written), so a delete is final, and a re-insert
  after it is a new row whatever its precombine value, exactly as with copy-on-write;
* of the ``upsert`` rows after the key's last barrier, the one with the greatest
  precombine value wins (nulls lowest), ties going to the later position. That is the
  copy-on-write rule "an incoming row older than the stored one is stale" applied at read
  time instead of write time, which is what lets an upsert write only its batch;
* a key whose last row is a barrier is absent.

Without a precombine field the later position always wins.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["LOG_OP", "LOG_UPSERT", "LOG_DELETE", "LOG_MOVE_OUT", "merge_slice", "plan_slice", "SlicePlan"]

#: the column of a log file saying what a row does (stored; dropped by readers like every ``_bi_`` column)
LOG_OP = "_bi_op"
LOG_UPSERT, LOG_DELETE, LOG_MOVE_OUT = "upsert", "delete", "move_out"
_POS = "_bi_pos"
_ROW = "_bi_row"


def merge_slice(base: pa.Table | None, logs: Sequence[pa.Table], *, key: str, precombine: str | None,
                columns: Sequence[str] | None = None) -> pa.Table:
    """The live rows of one file slice: ``base`` merged with ``logs`` (oldest first).

    ``columns`` (default: the base's, else the first log's minus ``LOG_OP``) are the output
    columns; every input must hold them plus ``key`` (and ``LOG_OP`` for logs). Row order
    is not kept: the base's live rows come first, then the logs' live rows.
    """
    if columns is None:
        first = base if base is not None else logs[0]
        columns = [c for c in first.column_names if c != LOG_OP]
    cols = list(columns)
    if not logs:
        return base.select(cols) if base is not None else pa.table({})
    plan = plan_slice(base, logs, key=key, precombine=precombine)
    parts = []
    if base is not None and base.num_rows:
        keep = np.ones(base.num_rows, dtype=bool)
        keep[plan.dropped] = False
        parts.append(base.select(cols).filter(pa.array(keep)))
    parts += [log.select(cols).take(pa.array(rows)) for log, rows in zip(logs, plan.live) if len(rows)]
    if not parts:
        return (base if base is not None else logs[0]).select(cols).schema.empty_table()
    out = pa.concat_tables(parts, promote_options="permissive")
    return out.cast(parts[0].schema) if base is not None and base.num_rows else out


class SlicePlan(NamedTuple):
    """What merging a slice keeps: every base row but ``dropped`` (positions in the base
    file), and of log ``i`` the rows at positions ``live[i]``."""

    dropped: np.ndarray
    live: list[np.ndarray]


def plan_slice(base: pa.Table | None, logs: Sequence[pa.Table], *, key: str, precombine: str | None) -> SlicePlan:
    """The merge of a slice as positions, from its keys (and precombine values) alone.

    ``base`` needs only ``key`` (and ``precombine``), in file order; each log ``key``,
    ``precombine`` and ``LOG_OP``. Positions refer to rows of the files as stored, so a
    reader can apply the plan to rows it reads some other way (Spark's Parquet reader reads
    a base's columns while only the keys cross into Python).
    """
    need = [key] + ([precombine] if precombine else [])
    parts = []
    touched_rows = np.zeros(0, dtype=np.int64)
    if base is not None and base.num_rows:
        # most of a base is untouched by its logs: only rows whose key a log names take part
        log_keys = [lg.column(key).combine_chunks() for lg in logs if lg.num_rows]
        ktype = base.schema.field(key).type
        value_set = pa.concat_arrays([k.cast(ktype) for k in log_keys]) if log_keys else pa.array([], ktype)
        touched = pc.is_in(base.column(key), value_set=value_set)
        touched_rows = np.flatnonzero(touched.to_numpy(zero_copy_only=False))
        if touched_rows.size:
            parts.append(_tagged(base.select(need).take(pa.array(touched_rows)), 0, touched_rows, LOG_UPSERT))
    for i, log in enumerate(logs, start=1):
        if log.num_rows:
            parts.append(_tagged(log.select(need), i, np.arange(log.num_rows), None, log.column(LOG_OP)))
    winners_pos, winners_row = _winners(parts, key, precombine)
    base_kept = winners_row[winners_pos == 0]
    dropped = np.setdiff1d(touched_rows, base_kept, assume_unique=True)
    live = [np.sort(winners_row[winners_pos == i]) for i in range(1, len(logs) + 1)]
    return SlicePlan(dropped=dropped, live=live)


def _winners(parts: list[pa.Table], key: str, precombine: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(position, row) of the live row of every key over ``parts`` (the rules above).

    Keys and precombine values become integers first (a dictionary code per key, a dense
    rank per value, nulls lowest), so the grouping is numpy sorts of integers rather than
    sorts of strings: this runs for every file group with logs on every read.
    """
    empty = np.zeros(0, dtype=np.int64)
    if not parts:
        return empty, empty
    allrows = pa.concat_tables(parts, promote_options="permissive")
    n = allrows.num_rows
    pos = allrows.column(_POS).to_numpy()
    row = allrows.column(_ROW).to_numpy()
    gid = allrows.column(key).combine_chunks().dictionary_encode().indices.to_numpy(zero_copy_only=False)
    barrier = pc.fill_null(pc.not_equal(allrows.column(LOG_OP), LOG_UPSERT), False).to_numpy(zero_copy_only=False)
    # 1. the last barrier position per key (-1: none)
    last_barrier = np.full(int(gid.max()) + 1 if n else 0, -1, dtype=np.int64)
    np.maximum.at(last_barrier, gid[barrier], pos[barrier].astype(np.int64))
    # 2. live candidates: upserts after their key's last barrier
    live = ~barrier & (pos > last_barrier[gid])
    if not live.any():
        return empty, empty
    cand = np.flatnonzero(live)
    # 3. the winner per key: greatest (precombine, position); nulls lowest
    sort_cols = [pos[cand], gid[cand]]
    if precombine:
        values = allrows.column(precombine).take(pa.array(cand))
        rank = pc.rank(values, sort_keys="ascending", tiebreaker="dense").to_numpy().astype(np.int64)
        sort_cols.insert(1, np.where(pc.is_null(values).to_numpy(zero_copy_only=False), 0, rank))  # nulls lowest
    order = cand[np.lexsort(sort_cols)]  # by key, then precombine, then position
    g = gid[order]
    last = np.append(np.flatnonzero(g[1:] != g[:-1]), len(g) - 1)
    won = order[last]
    return pos[won].astype(np.int64), row[won]


def _tagged(t: pa.Table, pos: int, rows: np.ndarray, op: str | None, ops: pa.ChunkedArray | None = None) -> pa.Table:
    n = t.num_rows
    t = t.append_column(_POS, pa.array(np.full(n, pos, dtype=np.int32)))
    t = t.append_column(_ROW, pa.array(rows.astype(np.int64)))
    return t.append_column(LOG_OP, pa.array([op] * n, pa.string()) if ops is None else ops.cast(pa.string()))
