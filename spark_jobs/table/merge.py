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
  precombine value wins (format.md §8's order, :mod:`spark_jobs.table.ordering`: nulls lowest,
  NaN highest), ties going to the later position. That is the copy-on-write rule "an
  incoming row older than the stored one is stale" applied at read time instead of write
  time, which is what lets an upsert write only its batch;
* a key whose last row is a barrier is absent.

Without a precombine field the later position always wins.

A *partial* log (``--partial-update``; format.md §5.1) carries only some user columns and
names them in its Parquet schema metadata (:data:`LOG_COLUMNS_KEY`). A slice holding one is
folded per key in position order instead: after the last barrier, a row is *accepted* when
its precombine value is at least the greatest accepted so far (nulls lowest, ties accepted;
every row without a precombine field), and each column takes its value from the last
accepted row that carries it (the base and full logs carry every column; none: null). With
full rows only this picks the same row as the rule above, so slices without a partial log
keep the vectorised plan, which is the hot path of every read.
"""

from __future__ import annotations

import json
from typing import NamedTuple, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.io.arrays import from_numpy, unique
from spark_jobs.table.ordering import ranks

__all__ = ["LOG_OP", "LOG_UPSERT", "LOG_DELETE", "LOG_MOVE_OUT", "LOG_COLUMNS_KEY", "merge_slice", "plan_slice",
           "SlicePlan", "log_columns", "partial_log_metadata"]

#: the column of a log file saying what a row does (stored; dropped by readers like every ``_bi_`` column)
LOG_OP = "_bi_op"
LOG_UPSERT, LOG_DELETE, LOG_MOVE_OUT = "upsert", "delete", "move_out"
_POS = "_bi_pos"
_ROW = "_bi_row"
#: the Parquet schema metadata key of a partial log: the JSON list of the user columns it carries
#: (a log without it carries every column). Readers decide by it, not by the columns a file
#: holds: a reader that conforms files to the snapshot's schema fills the others with nulls.
LOG_COLUMNS_KEY = b"bucketindex.columns"


def partial_log_metadata(columns: Sequence[str]) -> dict[bytes, bytes]:
    """The schema metadata of a partial log carrying ``columns`` (user columns)."""
    return {LOG_COLUMNS_KEY: json.dumps(list(columns), ensure_ascii=False).encode()}


def log_columns(log: pa.Table) -> frozenset[str] | None:
    """The user columns a log carries (:data:`LOG_COLUMNS_KEY`); None for a full log."""
    md = log.schema.metadata
    raw = md.get(LOG_COLUMNS_KEY) if md else None
    return None if raw is None else frozenset(json.loads(raw))


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
    carried = [log_columns(lg) for lg in logs]
    if any(c is not None for c in carried):
        return _merge_partial(base, logs, carried, key=key, precombine=precombine, cols=cols)
    plan = plan_slice(base, logs, key=key, precombine=precombine)
    parts = []
    if base is not None and base.num_rows:
        keep = np.ones(base.num_rows, dtype=bool)
        keep[plan.dropped] = False
        parts.append(base.select(cols).filter(from_numpy(keep)))
    parts += [log.select(cols).take(from_numpy(rows)) for log, rows in zip(logs, plan.live) if len(rows)]
    if not parts:
        return (base if base is not None else logs[0]).select(cols).schema.empty_table()
    out = pa.concat_tables(parts, promote_options="permissive")
    return out.cast(parts[0].schema) if base is not None and base.num_rows else out


class SlicePlan(NamedTuple):
    """What merging a slice keeps: every base row but ``dropped`` (positions in the base
    file), and of log ``i`` the rows at positions ``live[i]``.

    ``partial``: the slice holds a partial log, whose rows overlay stored values column by
    column -- no choice of whole rows expresses that. The plan then drops every row of every
    file, and a positional reader must merge the slice with :func:`merge_slice` instead."""

    dropped: np.ndarray
    live: list[np.ndarray]
    partial: bool = False


def plan_slice(base: pa.Table | None, logs: Sequence[pa.Table], *, key: str, precombine: str | None) -> SlicePlan:
    """The merge of a slice as positions, from its keys (and precombine values) alone.

    ``base`` needs only ``key`` (and ``precombine``), in file order; each log ``key``,
    ``precombine`` and ``LOG_OP``. Positions refer to rows of the files as stored, so a
    reader can apply the plan to rows it reads some other way (Spark's Parquet reader reads
    a base's columns while only the keys cross into Python). A slice with a partial log gets
    a plan with ``partial`` set that keeps nothing (:class:`SlicePlan`).
    """
    if any(log_columns(lg) is not None for lg in logs):
        none = np.zeros(0, dtype=np.int64)
        everything = np.arange(base.num_rows if base is not None else 0, dtype=np.int64)
        return SlicePlan(dropped=everything, live=[none for _ in logs], partial=True)
    parts, touched_rows = _candidates(base, logs, key=key, precombine=precombine)
    winners_pos, winners_row = _winners(parts, key, precombine)
    base_kept = winners_row[winners_pos == 0]
    dropped = np.setdiff1d(touched_rows, base_kept, assume_unique=True)
    live = [np.sort(winners_row[winners_pos == i]) for i in range(1, len(logs) + 1)]
    return SlicePlan(dropped=dropped, live=live)


def _candidates(base: pa.Table | None, logs: Sequence[pa.Table], *, key: str,
                precombine: str | None) -> tuple[list[pa.Table], np.ndarray]:
    """The rows a slice's merge decides between, tagged with their position (0: the base) and
    row: the base rows whose key some log names (most of a base is untouched by its logs: only
    those take part; returned as the second value) and every log row, with the key, the
    precombine value and the op. Both merges (the positional plan and the partial fold) start here."""
    need = [key] + ([precombine] if precombine else [])
    parts = []
    touched_rows = np.zeros(0, dtype=np.int64)
    if base is not None and base.num_rows:
        log_keys = [lg.column(key).combine_chunks() for lg in logs if lg.num_rows]
        ktype = base.schema.field(key).type
        value_set = pa.concat_arrays([k.cast(ktype) for k in log_keys]) if log_keys else pa.array([], ktype)
        touched = pc.is_in(base.column(key), value_set=value_set)
        touched_rows = np.flatnonzero(touched.to_numpy(zero_copy_only=False))
        if touched_rows.size:
            parts.append(_tagged(base.select(need).take(from_numpy(touched_rows)), 0, touched_rows, LOG_UPSERT))
    for i, log in enumerate(logs, start=1):
        if log.num_rows:
            parts.append(_tagged(log.select(need), i, np.arange(log.num_rows), None, log.column(LOG_OP)))
    return parts, touched_rows


def _merge_partial(base: pa.Table | None, logs: Sequence[pa.Table], carried: list[frozenset[str] | None], *,
                   key: str, precombine: str | None, cols: list[str]) -> pa.Table:
    """:func:`merge_slice` of a slice holding a partial log: the fold of the module doc.

    Vectorised like :func:`_winners`: keys and precombine values become integer codes; the
    rows of each key after its last barrier are sorted by position, and a row is accepted
    when its precombine rank equals the running maximum of its key's ranks so far (a
    rejected row is below that maximum, so it never raises it: the running maximum of all
    candidates is the running maximum of the accepted ones). Each output column then takes
    the last accepted row of each key among the files carrying it. Untouched base rows pass
    through as they are.
    """
    parts, touched_rows = _candidates(base, logs, key=key, precombine=precombine)
    first = base if base is not None else logs[0]
    out_schema = pa.schema([first.schema.field(c) if c in first.column_names else
                            next(lg.schema.field(c) for lg in logs if c in lg.column_names) for c in cols])
    kept = []
    if base is not None and base.num_rows:
        keep = np.ones(base.num_rows, dtype=bool)
        keep[touched_rows] = False
        kept.append(base.select(cols).filter(pa.array(keep)).cast(out_schema))
    if parts:
        allrows = pa.concat_tables(parts, promote_options="permissive")
        pos = allrows.column(_POS).to_numpy().astype(np.int64)
        row = allrows.column(_ROW).to_numpy()
        gid = allrows.column(key).combine_chunks().dictionary_encode().indices.to_numpy(zero_copy_only=False)
        gid = gid.astype(np.int64)
        barrier = pc.fill_null(pc.not_equal(allrows.column(LOG_OP), LOG_UPSERT), False).to_numpy(zero_copy_only=False)
        last_barrier = np.full(int(gid.max()) + 1, -1, dtype=np.int64)
        np.maximum.at(last_barrier, gid[barrier], pos[barrier])
        cand = np.flatnonzero(~barrier & (pos > last_barrier[gid]))
        order = cand[np.lexsort((pos[cand], gid[cand]))]  # by key, then position
        if precombine and order.size:
            rank = ranks(allrows.column(precombine).take(pa.array(order)))  # format.md §8's order
            v = gid[order] * (int(rank.max()) + 1) + rank  # the key's offset resets the running max per key
            order = order[v == np.maximum.accumulate(v)]
        if order.size:
            kept.append(_overlay(base, logs, carried, key, order, pos, row, gid, cols, out_schema))
    if not kept:
        return out_schema.empty_table()
    return pa.concat_tables(kept)


def _overlay(base: pa.Table | None, logs: Sequence[pa.Table], carried: list[frozenset[str] | None], key: str,
             accepted: np.ndarray, pos: np.ndarray, row: np.ndarray, gid: np.ndarray, cols: list[str],
             schema: pa.Schema) -> pa.Table:
    """One row per key of ``accepted`` (rows sorted by key, then position): each column from
    the key's last accepted row whose file carries it, null when none does."""
    live = unique(gid[accepted])
    out = []
    for c in cols:
        typ = schema.field(c).type
        sources: list[pa.ChunkedArray | pa.Array] = []
        offsets = np.full(len(logs) + 1, -1, dtype=np.int64)  # -1: the file at this position lacks c
        total = 0
        files = [(0, base, None)] + [(i, lg, carried[i - 1]) for i, lg in enumerate(logs, start=1)]
        for p, t, carries in files:
            if t is None or (carries is not None and c not in carries and c != key):
                continue
            col = t.column(c) if c in t.column_names else pa.nulls(t.num_rows, typ)
            sources.append(col.cast(typ) if not col.type.equals(typ) else col)
            offsets[p] = total
            total += t.num_rows
        src = np.full(int(gid.max()) + 1, -1, dtype=np.int64)
        sel = accepted[offsets[pos[accepted]] >= 0]
        if sel.size:
            g = gid[sel]
            last = np.append(np.flatnonzero(g[1:] != g[:-1]), len(g) - 1)  # the last carrying row per key
            src[g[last]] = offsets[pos[sel[last]]] + row[sel[last]]
        idx = src[live]
        column = pa.chunked_array([a for s in sources for a in (s.chunks if isinstance(s, pa.ChunkedArray) else [s])],
                                  type=typ) if sources else pa.chunked_array([], type=typ)
        if not sources or (idx < 0).all():
            out.append(pa.nulls(len(idx), typ))
        else:
            out.append(column.take(pa.array(idx, mask=idx < 0)))
    return pa.table(out, schema=schema)


def _winners(parts: list[pa.Table], key: str, precombine: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(position, row) of the live row of every key over ``parts`` (the rules above).

    Keys and precombine values become integers first (a dictionary code per key, a dense
    rank per value in format.md §8's order: :func:`~spark_jobs.table.ordering.ranks`), so the
    grouping is numpy sorts of integers rather than sorts of strings: this runs for every file
    group with logs on every read.
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
        sort_cols.insert(1, ranks(allrows.column(precombine).take(from_numpy(cand))))  # format.md §8's order
    order = cand[np.lexsort(sort_cols)]  # by key, then precombine, then position
    g = gid[order]
    last = np.append(np.flatnonzero(g[1:] != g[:-1]), len(g) - 1)
    won = order[last]
    return pos[won].astype(np.int64), row[won]


def _tagged(t: pa.Table, pos: int, rows: np.ndarray, op: str | None, ops: pa.ChunkedArray | None = None) -> pa.Table:
    n = t.num_rows
    t = t.append_column(_POS, from_numpy(np.full(n, pos, dtype=np.int32)))
    t = t.append_column(_ROW, from_numpy(rows.astype(np.int64)))
    return t.append_column(LOG_OP, pa.array([op] * n, pa.string()) if ops is None else ops.cast(pa.string()))
