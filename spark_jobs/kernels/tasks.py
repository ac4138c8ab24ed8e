"""The work Spark tasks do on executors, as plain functions over Arrow tables.

Kept free of ``pyspark`` so the logic is unit-testable without a JVM; the jobs wrap these
with ``groupBy(...).applyInArrow`` or ``mapInArrow``. Each function receives everything it
needs (table URI, file lists, schema) as arguments, because it runs in a separate Python worker.
"""

from __future__ import annotations

import functools
import posixpath
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.io import parquet, storage
from spark_jobs.index.record_index import (
    SEALED_SUFFIX,
    IndexEntries,
    compact_entries,
    lookup,
    write_index_file,
)
from spark_jobs.io.arrays import from_numpy
from spark_jobs.table.layout import data_file_name, is_reference, log_file_name
from spark_jobs.table.merge import LOG_DELETE, LOG_MOVE_OUT, LOG_OP, LOG_UPSERT, log_columns, partial_log_metadata
from spark_jobs.table.ordering import older
from spark_jobs.table.reader import read_data_file, read_slice, read_slice_plan, slice_value_bound
from spark_jobs.table.table import Table
from spark_jobs.table import faults
from spark_jobs.table.faults import maybe_crash

__all__ = [
    "KEY",
    "OP",
    "MERGE_OUTPUT",
    "LOOKUP_OUTPUT",
    "DELTA_OUTPUT",
    "MergeContext",
    "lookup_bucket",
    "merge_file_group",
    "append_log",
    "write_index_reads",
    "write_index_delta",
    "FILE_LIST_SCHEMA",
    "bind_batches",
    "read_file_keys",
    "verify_files",
    "VERIFY_OUTPUT",
    "read_slices",
    "slice_drops",
    "read_partial_slices",
    "DROPS_SCHEMA",
    "compact_slices",
    "COMPACT_INPUT",
    "COMPACT_INPUT_ARROW",
    "COMPACT_OUTPUT",
    "COMPACT_INDEX_INPUT",
    "COMPACT_INDEX_INPUT_ARROW",
    "COMPACT_INDEX_OUTPUT",
    "write_index_base",
]

KEY = "_bi_key"  # the canonical record key, stored in every data file
OP = "_bi_op"  # upsert | delete | move_in | move_out (routing; a log stores its own LOG_OP)
#: whether the index found the key in the target file group (null: unknown, the bucket index)
FOUND = "_bi_found"
UPSERT, DELETE, MOVE_IN, MOVE_OUT = "upsert", "delete", "move_in", "move_out"

LOOKUP_OUTPUT = "_bi_key string, _bi_old_part string, _bi_old_fid string"
MERGE_OUTPUT = (
    "kind string, part string, fid string, path string, num_rows long, size long, "
    "inserted long, updated long, deleted long, key string, tomb boolean, log boolean, row_delta long"
)
DELTA_OUTPUT = "bucket int, path string, entries long, size long"
#: one row per file group a data compaction folds, and what it wrote for it
COMPACT_INPUT = "part string, fid string, base string, logs array<string>"
#: ``COMPACT_INPUT`` in Arrow (a plan's rows travel to the tasks as an Arrow table)
COMPACT_INPUT_ARROW = pa.schema([("part", pa.string()), ("fid", pa.string()), ("base", pa.string()),
                                 ("logs", pa.list_(pa.string()))])
COMPACT_OUTPUT = "part string, fid string, path string, num_rows long, size long"
#: per planned index bucket: the files it folds (open base, deltas) and its sealed bases
COMPACT_INDEX_INPUT = "bucket int, files array<string>, sealed array<string>"
#: ``COMPACT_INDEX_INPUT`` in Arrow
COMPACT_INDEX_INPUT_ARROW = pa.schema([("bucket", pa.int32()), ("files", pa.list_(pa.string())),
                                       ("sealed", pa.list_(pa.string()))])
COMPACT_INDEX_OUTPUT = "bucket int, path string, entries long, size long, sealed boolean"
#: one row per live file slice, for ``mapInArrow`` readers (paths relative to the table root;
#: ``logs``: a merge-on-read slice's logs in commit order, empty otherwise)
FILE_LIST_SCHEMA = "path string, part string, fid string, logs array<string>"
#: rows a merge drops: (``xxhash64`` of the file's name, row index in the file)
DROPS_SCHEMA = "_bi_f long, _bi_r long"
#: rows per Arrow batch a reader yields: bounds a task's memory whatever the file size
READ_BATCH_ROWS = 64 * 1024


def bind(fn, **kwargs):  # type: ignore[no-untyped-def]
    """``fn`` with keyword arguments bound, as a plain two-argument function.

    PySpark 4.2's ``applyInArrow`` inspects the function's signature to pick the UDF kind
    and fails on ``functools.partial``; a closure inspects cleanly. The driver's fault
    injection settings and storage options travel with it (see :mod:`spark_jobs.table.faults`
    and :mod:`spark_jobs.io.storage`): executors on a cluster, and a Spark Connect server's
    workers, do not inherit the client's environment.
    """
    fault_env, storage_options = faults.carried(), storage.carried()

    def grouped(key, table):  # type: ignore[no-untyped-def]
        faults.adopt(fault_env)
        storage.adopt(storage_options)
        return fn(key, table, **kwargs)

    return grouped


def bind_batches(fn: Callable[..., Iterator[pa.RecordBatch]], **kwargs: Any
                 ) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``fn`` with keyword arguments bound, as the one-argument function ``mapInArrow`` calls
    (fault settings and storage options carried as in :func:`bind`)."""
    fault_env, storage_options = faults.carried(), storage.carried()

    def mapped(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        faults.adopt(fault_env)
        storage.adopt(storage_options)
        return fn(batches, **kwargs)

    return mapped


def _table(uri: str) -> Table:
    """The table handle of a Python worker, opened once: a task calls the per-group functions
    once per file group (hundreds of small logs for a merge-on-read upsert), and a handle is
    immutable here (tasks only read files and write new ones). Keyed by the storage options
    too: a reused worker may serve a driver with other ones."""
    return _open_table(uri, tuple(sorted(storage.configured().items())))


@functools.lru_cache(maxsize=8)
def _open_table(uri: str, _options: tuple[tuple[str, str], ...]) -> Table:
    return Table.open(uri)


def task_token() -> str:
    """``<partition>-<stage>-<attempt>``: unique per task attempt, so a retried or
    speculative attempt writes a different file and never clobbers a sibling."""
    # The kernels never import pyspark (tests/unit/test_layering.py): a Spark task's worker has
    # loaded it already, so ask the loaded module; anywhere else there is no task attempt to name.
    pyspark = sys.modules.get("pyspark")
    task_context = getattr(pyspark, "TaskContext", None)
    if task_context is None:  # not in a Spark task (the Arrow engine, unit tests)
        return "0-0-0"
    tc = task_context.get()
    if tc is not None:
        return f"{tc.partitionId()}-{tc.stageId()}-{tc.attemptNumber()}"
    return "0-0-0"


def lookup_bucket(key: tuple, keys: pa.Table, *, table_uri: str, files: dict[int, list[str]]) -> pa.Table:
    """Tag one index bucket's batch keys with their current (partition, file id)."""
    bucket = key[0].as_py()
    rels = files.get(bucket, [])
    empty = pa.table({KEY: pa.array([], pa.string()), "_bi_old_part": pa.array([], pa.string()),
                      "_bi_old_fid": pa.array([], pa.string())})
    if not rels or keys.num_rows == 0:
        return empty
    t = _table(table_uri)
    column = keys.column(KEY)
    res = lookup(t.io, [t.abs(r) for r in rels], column.to_pylist())  # the hashing needs Python strings
    hit = from_numpy(np.nonzero(res.found)[0])
    if len(hit) == 0:
        return empty
    # the hits' keys and locations by index (Arrow takes), not a Python loop per hit
    at = from_numpy(res.loc[hit.to_numpy()])
    return pa.table(
        {
            KEY: column.take(hit).cast(pa.string()),
            "_bi_old_part": pa.array([p for p, _ in res.locations], pa.string()).take(at),
            "_bi_old_fid": pa.array([f for _, f in res.locations], pa.string()).take(at),
        }
    )


@dataclass
class MergeContext:
    table_uri: str
    instant: str
    schema: pa.Schema  # the data file schema (user columns + KEY)
    base_files: dict[str, str]  # "<part>\x00<fid>" -> current file (relative path)
    precombine: str | None
    emit_index: bool  # record index: report new locations and tombstones
    snapshot_seq: int  # the sequence position the writer planned on (rollback checks read past it)
    partition_dirs: dict[str, str] = field(default_factory=dict)
    #: merge-on-read: "<part>\x00<fid>" -> the slice's logs (relative paths, commit order)
    log_files: dict[str, list[str]] = field(default_factory=dict)
    #: the token in the names of the files this task writes; None: the Spark task attempt's
    #: (:func:`task_token`). The in-process engine names each group and attempt itself.
    write_token: str | None = None
    #: ``--partial-update``: the user columns the batch carries (None: all). Copy-on-write keeps
    #: an updated row's stored values of the others; merge-on-read writes a partial log
    carried: list[str] | None = None


def merge_file_group(key: tuple, incoming: pa.Table, *, ctx: MergeContext) -> pa.Table:
    """Copy-on-write merge of one file group with its incoming upserts and deletes.

    Writes the new file slice (under a marker) and returns one ``file`` row describing it
    plus, for the record index, one ``index`` row per key whose location changed.
    """
    part, fid = key[0].as_py(), key[1].as_py()
    t = _table(ctx.table_uri)
    names = ctx.schema.names
    base_rel = ctx.base_files.get(f"{part}\x00{fid}")
    if base_rel:
        # in the schema this commit writes: a base from before a column was added or widened
        # reads it as null or widened (schema.conform), and the new base is written in it
        base = read_data_file(t, base_rel, names, schema=ctx.schema)
    else:
        base = ctx.schema.empty_table()
    ops = incoming.column(OP)
    in_keys = incoming.column(KEY)
    pos = pc.index_in(in_keys, value_set=base.column(KEY))  # position of the key in the base
    in_base = pc.is_valid(pos)
    effective = from_numpy(np.ones(incoming.num_rows, dtype=bool))
    if ctx.precombine and base.num_rows:
        stored = pc.take(base.column(ctx.precombine), pos)
        inc = incoming.column(ctx.precombine).cast(ctx.schema.field(ctx.precombine).type)
        stale = pc.and_(pc.and_(in_base, older(inc, stored)), pc.not_equal(ops, MOVE_OUT))
        effective = pc.invert(pc.fill_null(stale, False))
    is_upsert = pc.is_in(ops, value_set=pa.array([UPSERT, MOVE_IN]))
    is_delete = pc.is_in(ops, value_set=pa.array([DELETE, MOVE_OUT]))
    upserts = pc.and_(effective, is_upsert)
    removes = pc.and_(effective, pc.and_(in_base, pc.or_(is_upsert, is_delete)))
    removed_keys = pc.filter(in_keys, removes)
    keep = pc.invert(pc.is_in(base.column(KEY), value_set=removed_keys))
    new_rows = incoming.filter(upserts).select(names).cast(ctx.schema)
    if ctx.carried is not None:  # partial update: the columns the batch lacks keep the stored row's values
        new_rows = _keep_stored(new_rows, base, pc.filter(pos, upserts), pc.filter(pc.equal(ops, UPSERT), upserts),
                                carried=ctx.carried, schema=ctx.schema)
    result = pa.concat_tables([base.filter(keep), new_rows])

    op_is = lambda v: pc.equal(ops, v)  # noqa: E731
    inserted = pc.and_(upserts, pc.and_(pc.invert(in_base), op_is(UPSERT)))
    updated = pc.or_(pc.and_(upserts, in_base), pc.and_(upserts, op_is(MOVE_IN)))
    deleted = pc.and_(pc.and_(effective, in_base), op_is(DELETE))
    counts = [int(pc.sum(pc.cast(c, pa.int64())).as_py() or 0) for c in (inserted, updated, deleted)]

    rel, size = None, 0
    if result.num_rows:
        rel = posixpath.join(ctx.partition_dirs.get(part, part), data_file_name(fid, ctx.write_token or task_token(), ctx.instant))
        size = write_marked_parquet(t, ctx.instant, rel, result, snapshot_seq=ctx.snapshot_seq)

    schema = _merge_schema()
    file_row = pa.table(
        {"kind": ["file"], "part": [part], "fid": [fid], "path": [rel], "num_rows": [result.num_rows], "size": [size],
         "inserted": [counts[0]], "updated": [counts[1]], "deleted": [counts[2]], "key": [None], "tomb": [None],
         "log": [False], "row_delta": [None]},
        schema=schema,
    )
    decided = _read_rows(part, fid, in_keys, pc.or_(pc.invert(effective), pc.and_(op_is(DELETE), pc.invert(in_base))))
    if not ctx.emit_index:
        return pa.concat_tables([file_row, decided])
    return pa.concat_tables([file_row, _index_rows(part, fid, in_keys, pc.and_(upserts, pc.invert(in_base)), deleted),
                             decided])


def _read_rows(part: str, fid: str, in_keys: Any, mask: Any) -> pa.Table:
    """``read`` rows: the keys of this group's batch rows decided without effect -- dropped as
    stale against the stored row, or deletes of a key the group does not hold. Nothing is
    written for them, so the commit records them for the conflict check
    (``spark_jobs.table.action.upsert.read_set``, format.md §4.5)."""
    keys = _flat(pc.filter(in_keys, pc.fill_null(mask, False)))
    return _key_rows("read", part, fid, keys, tomb=pa.nulls(len(keys), pa.bool_()))


def _flat(a: Any) -> pa.Array:
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a


def _key_rows(kind: str, part: str, fid: str, keys: pa.Array, *, tomb: pa.Array) -> pa.Table:
    """A merge task's per-key output rows (``index`` or ``read``) of one file group; the file
    columns are null."""
    n = len(keys)
    nulls = {name: pa.nulls(n, typ) for name, typ in (
        ("path", pa.string()), ("num_rows", pa.int64()), ("size", pa.int64()), ("inserted", pa.int64()),
        ("updated", pa.int64()), ("deleted", pa.int64()), ("log", pa.bool_()), ("row_delta", pa.int64()))}
    return pa.table(
        {"kind": pa.array([kind] * n, pa.string()), "part": pa.array([part] * n, pa.string()),
         "fid": pa.array([fid] * n, pa.string()), **nulls, "key": keys.cast(pa.string()), "tomb": tomb},
        schema=_merge_schema(),
    )


def _keep_stored(rows: pa.Table, stored: pa.Table, at: Any, update: Any, *, carried: list[str],
                 schema: pa.Schema) -> pa.Table:
    """``rows`` with the stored values (``stored`` row ``at``) of the columns a partial batch
    lacks, where ``update`` (an in-place upsert of a stored key). An insert keeps its nulls; a
    key moving in keeps the values the engine fetched from its old file group."""
    where = pc.fill_null(pc.and_(update, pc.is_valid(at)), False)
    for i, name in enumerate(rows.column_names):
        if name != KEY and name in schema.names and name not in carried:
            kept = pc.if_else(where, pc.take(stored.column(name), at), rows.column(name))
            rows = rows.set_column(i, schema.field(name), kept)
    return rows


def write_marked_parquet(t: Table, instant: str, rel: str, rows: pa.Table, *, snapshot_seq: int) -> int:
    """Write one data file of ``instant`` -- its marker first, so a crash leaves nothing
    unaccounted for (format.md §4 step 6), and nothing left behind a rollback that overtook
    the task (:meth:`Table.write_marked`) -- and return its size."""
    path = t.layout.data_path(rel)  # under the root, outside .bucketindex/, never a reference file

    def write() -> None:
        with t.io.open_output_stream(path) as out:
            parquet.write_table(rows, out, compression="zstd")  # every page checksummed (io.parquet)
        maybe_crash("after_data_file")

    t.write_marked(instant, rel, write, snapshot_seq=snapshot_seq)
    return t.io.size(path)


def _index_rows(part: str, fid: str, in_keys: pa.ChunkedArray, new_mask: Any, gone_mask: Any) -> pa.Table:
    """Record index: new locations for inserts and keys moving in; tombstones for deletes."""
    new_loc = _flat(pc.filter(in_keys, new_mask))
    keys = pa.concat_arrays([new_loc, _flat(pc.filter(in_keys, gone_mask))])
    return _key_rows("index", part, fid, keys, tomb=from_numpy(np.arange(len(keys)) >= len(new_loc)))


def _deletes_not_older_than_slice(t: Table, base_rel: str, logs: list[str], deletes: pa.Table, *,
                                  ctx: MergeContext) -> bool:
    """Whether every delete of ``deletes`` is provably effective against its stored row (format.md
    §5.1: not older than it) from the slice's footers alone: not older than the greatest
    precombine value any file of the slice holds. ``False`` when the footers cannot tell, or a
    delete is older than that bound (it may still be effective: the caller reads the slice)."""
    assert ctx.precombine is not None
    bound = slice_value_bound(t, base_rel, logs, column=ctx.precombine, schema=ctx.schema)
    if bound is None:
        return False
    inc = deletes.column(ctx.precombine).cast(ctx.schema.field(ctx.precombine).type)
    stored = pc.take(bound, from_numpy(np.zeros(len(inc), dtype=np.int64)))
    return not bool(pc.any(older(inc, stored)).as_py())


def append_log(key: tuple, incoming: pa.Table, *, ctx: MergeContext) -> pa.Table:
    """Merge-on-read: write one file group's incoming rows as a log on top of its slice.

    Cost follows the batch: the slice is not read at all when the index says which keys it
    holds (record, global_simple) and no delete needs its precombine check -- none does when
    every delete is not older than the greatest precombine value the slice's footers record
    (:func:`~spark_jobs.table.reader.slice_value_bound`); otherwise only the key (and
    precombine) columns of the slice are read. Upserts that are stale against
    the stored row are dropped when the stored row was read, else left to the readers'
    merge, which applies the same rule (``spark_jobs.table.merge``). A new file group (no
    base yet) gets a base file, as copy-on-write writes it.
    """
    part, fid = key[0].as_py(), key[1].as_py()
    slice_key = f"{part}\x00{fid}"
    base_rel = ctx.base_files.get(slice_key)
    if base_rel is None:
        return merge_file_group(key, incoming, ctx=ctx)
    t = _table(ctx.table_uri)
    names = ctx.schema.names
    ops = incoming.column(OP)
    in_keys = incoming.column(KEY)
    found = incoming.column(FOUND) if FOUND in incoming.column_names else pa.nulls(incoming.num_rows, pa.bool_())
    is_delete = pc.equal(ops, DELETE)
    has_delete = bool(pc.any(is_delete).as_py())
    effective = from_numpy(np.ones(incoming.num_rows, dtype=bool))
    logs = ctx.log_files.get(slice_key, [])
    read_stored = bool(found.null_count)
    if not read_stored and ctx.precombine and has_delete:
        read_stored = not _deletes_not_older_than_slice(t, base_rel, logs, incoming.filter(is_delete), ctx=ctx)
    if read_stored:
        cols = [KEY] + ([ctx.precombine] if ctx.precombine else [])
        stored = read_slice(t, base_rel, logs, columns=cols, precombine=ctx.precombine, schema=ctx.schema)
        pos = pc.index_in(in_keys, value_set=stored.column(KEY))
        in_base = pc.is_valid(pos)
        if ctx.precombine and stored.num_rows:
            prev = pc.take(stored.column(ctx.precombine), pos)
            inc = incoming.column(ctx.precombine).cast(ctx.schema.field(ctx.precombine).type)
            stale = pc.and_(pc.and_(in_base, older(inc, prev)), pc.not_equal(ops, MOVE_OUT))
            effective = pc.invert(pc.fill_null(stale, False))
    else:
        in_base = pc.fill_null(found, False)
    is_upsert = pc.is_in(ops, value_set=pa.array([UPSERT, MOVE_IN]))
    upserts = pc.and_(effective, is_upsert)
    deleted = pc.and_(pc.and_(effective, in_base), is_delete)
    moved_out = pc.and_(in_base, pc.equal(ops, MOVE_OUT))
    keep = pc.or_(pc.or_(upserts, deleted), moved_out)
    log_op = pc.if_else(deleted, LOG_DELETE, pc.if_else(moved_out, LOG_MOVE_OUT, LOG_UPSERT))
    rows = incoming.select(names).cast(ctx.schema).append_column(LOG_OP, log_op).filter(keep)
    carried = ctx.carried
    if carried is not None and bool(pc.any(pc.equal(ops, MOVE_IN)).as_py()):
        # keys moving in carry every column (the engine fetched the lacking ones from their old
        # group): the log must be full, so this group's updates take their stored values here
        lacking = [n for n in names if n != KEY and n not in carried]
        stored = read_slice(t, base_rel, ctx.log_files.get(slice_key, []), columns=[KEY, *lacking],
                            precombine=ctx.precombine, schema=ctx.schema)
        at = pc.filter(pc.index_in(in_keys, value_set=stored.column(KEY)), keep)
        rows = _keep_stored(rows, stored, at, pc.filter(pc.equal(ops, UPSERT), keep), carried=carried,
                            schema=ctx.schema)
        carried = None
    if carried is not None:  # a partial log: the batch's columns only, named in its metadata (format.md §5.1)
        rows = rows.select([n for n in names if n == KEY or n in carried] + [LOG_OP])
        rows = rows.replace_schema_metadata(partial_log_metadata(carried))

    op_is = lambda v: pc.equal(ops, v)  # noqa: E731
    new_in_group = pc.and_(upserts, pc.invert(in_base))
    inserted = pc.and_(new_in_group, op_is(UPSERT))
    updated = pc.or_(pc.and_(upserts, in_base), pc.and_(upserts, op_is(MOVE_IN)))
    c = [int(pc.sum(pc.cast(m, pa.int64())).as_py() or 0) for m in (inserted, updated, deleted, new_in_group, moved_out)]
    row_delta = c[3] - c[2] - c[4]

    rel, size = None, 0
    if rows.num_rows:
        rel = posixpath.join(ctx.partition_dirs.get(part, part), log_file_name(fid, ctx.write_token or task_token(), ctx.instant))
        size = write_marked_parquet(t, ctx.instant, rel, rows, snapshot_seq=ctx.snapshot_seq)
    file_row = pa.table(
        {"kind": ["file"], "part": [part], "fid": [fid], "path": [rel], "num_rows": [rows.num_rows], "size": [size],
         "inserted": [c[0]], "updated": [c[1]], "deleted": [c[2]], "key": [None], "tomb": [None], "log": [True],
         "row_delta": [row_delta]},
        schema=_merge_schema(),
    )
    decided = _read_rows(part, fid, in_keys, pc.or_(pc.invert(effective), pc.and_(is_delete, pc.invert(in_base))))
    if not ctx.emit_index:
        return pa.concat_tables([file_row, decided])
    return pa.concat_tables([file_row, _index_rows(part, fid, in_keys, new_in_group, deleted), decided])


def _merge_schema() -> pa.Schema:
    types = {"string": pa.string(), "long": pa.int64(), "boolean": pa.bool_()}
    return pa.schema([(n, types[t]) for n, t in (c.split() for c in MERGE_OUTPUT.split(", "))])


def write_index_delta(key: tuple, entries: pa.Table, *, table_uri: str, instant: str, snapshot_seq: int) -> pa.Table:
    """Write one index bucket's delta for ``instant`` (new locations and tombstones)."""
    targets = [None if d else (p, f) for d, p, f in zip(entries.column("tomb").to_pylist(),
                                                          entries.column("part").to_pylist(),
                                                          entries.column("fid").to_pylist())]
    idx = IndexEntries.from_keys(entries.column("key").to_pylist(), targets)
    return _write_bucket_file(key[0].as_py(), idx, "delta", table_uri=table_uri, instant=instant,
                              snapshot_seq=snapshot_seq, crash_point="after_index_file")


def write_index_reads(key: tuple, entries: pa.Table, *, table_uri: str, instant: str, snapshot_seq: int) -> pa.Table:
    """Write one index bucket's ``read`` file for ``instant``: the fingerprints of the keys it
    decided without writing (``read`` rows), for the conflict check only -- not index content,
    so no snapshot's view lists it. Under a marker, as a delta, so a failed attempt's is rolled back."""
    keys = sorted(set(entries.column("key").to_pylist()))
    idx = IndexEntries.from_keys(keys, [None] * len(keys))
    return _write_bucket_file(key[0].as_py(), idx, "read", table_uri=table_uri, instant=instant,
                              snapshot_seq=snapshot_seq, extra={"kind": "read"})


def _write_bucket_file(bucket: int, idx: IndexEntries, kind: str, *, table_uri: str, instant: str,
                       snapshot_seq: int, crash_point: str | None = None,
                       extra: dict[str, str] | None = None) -> pa.Table:
    """Write one index bucket's ``kind`` file of ``instant`` under its marker; one output row."""
    t = _table(table_uri)  # its files only (io, layout): no table.json or timeline read per bucket
    path = t.layout.index_file(bucket, kind, instant)
    rel = t.layout.rel(path)

    def write() -> int:
        size = write_index_file(t.io, path, idx, metadata={"instant": instant, "bucket": bucket, **(extra or {})})
        if crash_point is not None:
            maybe_crash(crash_point)
        return size

    size = t.write_marked(instant, rel, write, snapshot_seq=snapshot_seq)
    return pa.table(
        {"bucket": pa.array([bucket], pa.int32()), "path": [rel], "entries": pa.array([len(idx)], pa.int64()),
         "size": pa.array([size], pa.int64())}
    )


def read_bucket_entries(key: tuple, _: pa.Table, *, table_uri: str, files: dict[int, list[str]]) -> pa.Table:
    """All live entries of one index bucket (for validate and shadow compare), fingerprints as int64."""
    from spark_jobs.index.record_index import merge_entries

    bucket = key[0].as_py()
    t = _table(table_uri)  # its files only (io, layout): no table.json or timeline read per bucket
    e = merge_entries(t.io, [t.abs(r) for r in files.get(bucket, [])])
    locs = e.targets()
    return pa.table(
        {
            "bucket": pa.array(np.full(len(e), bucket, np.int32)),
            "fp_hi": pa.array(e.fp_hi.view(np.int64)),
            "fp_lo": pa.array(e.fp_lo.view(np.int64)),
            "part": pa.array([l[0] for l in locs], pa.string()),  # type: ignore[index]
            "fid": pa.array([l[1] for l in locs], pa.string()),  # type: ignore[index]
        }
    )


def read_file_keys(files: Iterable[pa.RecordBatch], *, table_uri: str, part: str = "part",
                   fid: str = "fid") -> Iterator[pa.RecordBatch]:
    """mapInArrow over ``FILE_LIST_SCHEMA`` rows: ``(KEY, part, fid)`` for every row of each file.

    The file group of a key is the one whose file this task opened, by the relative path
    the snapshot's metadata names, through the table's FileIO. Spark's own reader would
    only say which file a row came from as a re-encoded URI (``input_file_name()`` turns
    ``%`` into ``%25``), which no longer equals the table's path.
    """
    t: Table | None = None
    for b in files:
        cols = [b.column(c).to_pylist() for c in ("path", "part", "fid", "logs")]
        for rel, p, f, logs in zip(*cols):
            if t is None:  # once per task, and only if it has files to read
                t = Table.open(table_uri)
            if logs:  # live keys do not depend on precombine values: merge on the key alone
                keys = read_slice(t, rel, logs, columns=[KEY]).column(KEY).combine_chunks()
                yield _labelled(keys, p, f, names=[KEY, part, fid])
            else:
                yield from _keys_of_file(t, rel, p, f, names=[KEY, part, fid])


#: what :func:`verify_files` yields: a damaged file (absolute path) and why
VERIFY_OUTPUT = pa.schema([("path", pa.string()), ("problem", pa.string())])


def verify_files(files: Iterable[pa.RecordBatch], *, table_uri: str) -> Iterator[pa.RecordBatch]:
    """mapInArrow over ``path string`` rows (relative paths of a snapshot's files): one
    ``VERIFY_OUTPUT`` row per file that is damaged, for ``validate``.

    A Parquet file (base, log, reference file) is read whole -- footer, every dictionary and
    data page, checksums verified (``io.parquet.verify``) -- a row group at a time; an index
    file is decoded whole and its invariants checked (``record_index.index_file_problem``).
    Keys alone (what the other checks read) would miss a damaged page of any other column.
    A file gone since the snapshot was listed is named too (``missing``)."""
    from spark_jobs.index.record_index import index_file_problem

    t: Table | None = None
    for b in files:
        out: list[tuple[str, str]] = []
        for rel in b.column("path").to_pylist():
            if t is None:
                t = _table(table_uri)
            path = t.abs(rel)
            try:
                if rel.endswith(".parquet") or is_reference(rel):
                    with t.io.open_input_file(path) as f:
                        parquet.verify(f, statistics=not is_reference(rel))  # a user's file: its writer's
                    problem = None
                else:
                    problem = index_file_problem(t.io, path)
            except FileNotFoundError:
                problem = "missing"
            except Exception as e:  # noqa: BLE001 - damage is a finding; anything else is raised
                if not parquet.is_damage(e):
                    raise
                problem = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            if problem is not None:
                out.append((path, problem))
        if out:
            yield pa.RecordBatch.from_arrays([pa.array([p for p, _ in out], pa.string()),
                                              pa.array([w for _, w in out], pa.string())], schema=VERIFY_OUTPUT)


def read_slices(files: Iterable[pa.RecordBatch], *, table_uri: str, schema: pa.Schema,
                precombine: str | None) -> Iterator[pa.RecordBatch]:
    """mapInArrow over ``FILE_LIST_SCHEMA`` rows: every live row of each merge-on-read slice,
    merged per file group in the task that reads it (no shuffle)."""
    t: Table | None = None
    for b in files:
        for rel, logs in zip(b.column("path").to_pylist(), b.column("logs").to_pylist()):
            if t is None:
                t = Table.open(table_uri)
            merged = read_slice(t, rel, logs or [], precombine=precombine, schema=schema)
            yield from merged.select(schema.names).cast(schema).to_batches(max_chunksize=READ_BATCH_ROWS)


def slice_drops(files: Iterable[pa.RecordBatch], *, table_uri: str, schema: pa.Schema,
                precombine: str | None) -> Iterator[pa.RecordBatch]:
    """mapInArrow over ``FILE_LIST_SCHEMA`` rows: the rows each slice's merge drops
    (``DROPS_SCHEMA``) -- of its base, and of its logs every row that is not live (stale or
    superseded updates, delete markers, moves out) -- planned from the key, precombine and
    op columns only, so a reader can scan every file of the slice as stored minus these."""
    from spark_jobs.index.hashing import bucket_hash  # Spark's xxhash64 of a string

    def named(rel: str, rows: np.ndarray) -> pa.RecordBatch:
        f = np.full(len(rows), bucket_hash(posixpath.basename(rel)), dtype=np.int64)
        return pa.RecordBatch.from_arrays([pa.array(f), pa.array(rows.astype(np.int64))], names=["_bi_f", "_bi_r"])

    t: Table | None = None
    for b in files:
        for rel, logs in zip(b.column("path").to_pylist(), b.column("logs").to_pylist()):
            if t is None:
                t = Table.open(table_uri)
            logs = logs or []
            plan, read = read_slice_plan(t, rel, logs, precombine=precombine, schema=schema)
            # a slice with a partial log drops every row here (plan.partial): read_partial_slices reads it
            if len(plan.dropped):
                yield named(rel, plan.dropped)
            for log_rel, log, live in zip(logs, read, plan.live):
                dead = np.setdiff1d(np.arange(log.num_rows), live, assume_unique=True)
                if len(dead):
                    yield named(log_rel, dead)


def read_partial_slices(files: Iterable[pa.RecordBatch], *, table_uri: str, schema: pa.Schema,
                        precombine: str | None) -> Iterator[pa.RecordBatch]:
    """mapInArrow over ``FILE_LIST_SCHEMA`` rows: every live row of each slice holding a partial
    log, merged whole (``merge.merge_slice``) -- the rows :func:`slice_drops` drops entirely,
    since a positional plan cannot overlay columns. A slice without one yields nothing; which
    is which shows in the logs' footers, read here on the executors rather than by the driver."""
    t: Table | None = None
    for b in files:
        for rel, logs in zip(b.column("path").to_pylist(), b.column("logs").to_pylist()):
            if not logs:
                continue
            if t is None:
                t = Table.open(table_uri)
            if not any(_is_partial_log(t, lg) for lg in logs):
                continue
            merged = read_slice(t, rel, logs, precombine=precombine, schema=schema)
            yield from merged.select(schema.names).cast(schema).to_batches(max_chunksize=READ_BATCH_ROWS)


def _is_partial_log(t: Table, rel: str) -> bool:
    """Whether a log is partial (``merge.LOG_COLUMNS_KEY`` in its footer's schema metadata)."""
    with t.io.open_input_file(t.abs(rel)) as f, parquet.table_file(t.abs(rel)):
        return log_columns(parquet.open_file(f).schema_arrow.empty_table()) is not None


def _keys_of_file(t: Table, rel: str, part: str, fid: str, *, names: list[str]) -> Iterator[pa.RecordBatch]:
    """The key column of one file, in bounded batches, each labelled with its file group."""
    if is_reference(rel):  # a bootstrapped user file: its keys are computed, not stored
        yield _labelled(read_data_file(t, rel, [KEY]).column(KEY).combine_chunks(), part, fid, names=names)
        return
    with t.io.open_input_file(t.abs(rel)) as src:
        with parquet.table_file(t.abs(rel)):
            batches = parquet.open_file(src).iter_batches(batch_size=READ_BATCH_ROWS, columns=[KEY])
        while True:
            with parquet.table_file(t.abs(rel)):  # a damaged page is named, not read as other keys
                b = next(batches, None)
            if b is None:
                return
            yield _labelled(b.column(0), part, fid, names=names)


def _labelled(keys: pa.Array, part: str, fid: str, *, names: list[str]) -> pa.RecordBatch:
    """Keys labelled with the file group they were read from."""
    loc = [pa.repeat(pa.scalar(v, pa.string()), len(keys)) for v in (part, fid)]
    return pa.RecordBatch.from_arrays([keys.cast(pa.string()), *loc], names=names)


def fingerprint_keys(batches, *, key_col: str = KEY):  # type: ignore[no-untyped-def]
    """mapInArrow: append fp_hi/fp_lo (int64 views of the uint64 fingerprint) to each batch."""
    from spark_jobs.index.hashing import fingerprints

    for b in batches:
        hi, lo = fingerprints(b.column(key_col).to_pylist())
        yield pa.RecordBatch.from_arrays(
            list(b.columns) + [pa.array(hi.view(np.int64)), pa.array(lo.view(np.int64))],
            names=list(b.schema.names) + ["fp_hi", "fp_lo"],
        )



def compact_slices(groups: Iterable[pa.RecordBatch], *, table_uri: str, instant: str, attempt: str,
                   schema: pa.Schema, precombine: str | None, snapshot_seq: int) -> Iterator[pa.RecordBatch]:
    """mapInArrow over ``COMPACT_INPUT``: fold each planned base and logs into a new base.

    Reads exactly the files the plan names (logs committed after the plan stay on top of the
    new base). The new base sits beside the old one, named with the compaction's instant and
    this attempt's token, so a retried or concurrent attempt never overwrites another's file.
    A group whose rows were all deleted gets an empty base: later logs may still need one.
    """
    t: Table | None = None
    out_schema = pa.schema([("part", pa.string()), ("fid", pa.string()), ("path", pa.string()),
                            ("num_rows", pa.int64()), ("size", pa.int64())])
    for b in groups:
        cols = [b.column(c).to_pylist() for c in ("part", "fid", "base", "logs")]
        for part, fid, base, logs in zip(*cols):
            if t is None:
                t = Table.open(table_uri)
            merged = read_slice(t, base, logs or [], precombine=precombine, schema=schema)
            merged = merged.select(schema.names).cast(schema)
            # beside the old base -- in the partition's directory, for a reference file outside the table
            directory = part if is_reference(base) else posixpath.dirname(base)
            rel = posixpath.join(directory, data_file_name(fid, f"{attempt}-{task_token()}", instant))
            size = write_marked_parquet(t, instant, rel, merged, snapshot_seq=snapshot_seq)
            yield pa.RecordBatch.from_pylist(
                [{"part": part, "fid": fid, "path": rel, "num_rows": merged.num_rows, "size": size}],
                schema=out_schema)


def compact_index_buckets(buckets: Iterable[pa.RecordBatch], *, table_uri: str, instant: str, attempt: str,
                          snapshot_seq: int, cap: int) -> Iterator[pa.RecordBatch]:
    """mapInArrow over ``COMPACT_INDEX_INPUT``: fold each planned index bucket into a new base.

    The planned files are the bucket's open base and its oldest deltas, merged newest-wins.
    A tombstone is dropped unless one of the bucket's sealed bases (older, never rewritten)
    still resolves its key (:func:`compact_entries`): otherwise no older file of the bucket
    remains for it to hide (a key deleted and re-inserted keeps its newest entry). A new base
    of more than ``cap`` entries is written *sealed* (format.md §6.1): later compactions of
    the bucket leave it alone, so their cost stays bounded by the cap. Deltas committed after
    the plan stay above the new base. The name carries the compaction's instant and this
    attempt's token, so a retried or concurrent attempt never overwrites another's file.
    """
    t: Table | None = None
    out_schema = pa.schema([("bucket", pa.int32()), ("path", pa.string()), ("entries", pa.int64()),
                            ("size", pa.int64()), ("sealed", pa.bool_())])
    for b in buckets:
        cols = [b.column(c).to_pylist() for c in ("bucket", "files", "sealed")]
        for bucket, files, sealed in zip(*cols):
            if t is None:
                t = Table.open(table_uri)
            merged = compact_entries(t.io, [t.abs(f) for f in files], sealed=[t.abs(f) for f in sealed or []])
            row = write_index_base(t, bucket, merged, instant=instant, attempt=attempt, snapshot_seq=snapshot_seq,
                                   cap=cap)
            yield pa.RecordBatch.from_pylist([row], schema=out_schema)


def write_index_base(t: Table, bucket: int, entries: IndexEntries, *, instant: str, attempt: str, snapshot_seq: int,
                     cap: int) -> dict[str, Any]:
    """Write ``entries`` as the new base of ``bucket`` for compaction ``instant`` under its marker
    (an index compaction's merge, or an index rebuild's scan of the data); one
    ``COMPACT_INDEX_OUTPUT`` row. More than ``cap`` entries: written *sealed* (format.md §6.1).
    The name carries the instant and the attempt's token, so a retried or concurrent attempt
    never overwrites another's file."""
    seal = len(entries) > cap
    # sealed or not shows in the name (is_sealed_base): the view knows without opening it
    path = t.layout.index_file(bucket, "base", f"{instant}_{attempt}{SEALED_SUFFIX if seal else ''}")
    rel = t.layout.rel(path)

    def write() -> int:
        size = write_index_file(t.io, path, entries, metadata={"instant": instant, "bucket": bucket, "sealed": seal})
        maybe_crash("after_index_file")
        return size

    size = t.write_marked(instant, rel, write, snapshot_seq=snapshot_seq)
    return {"bucket": bucket, "path": rel, "entries": len(entries), "size": size, "sealed": seal}
