"""The upsert in-process: :mod:`spark_jobs.table.action.upsert` executed on Arrow tables.

The batch is read by pyarrow, validated, cast and deduplicated under the action's rules;
tagging, routing and the file-group plan are pyarrow compute and numpy; each touched file
group is merged (or gets its log) and each touched index bucket gets its delta by the same
functions Spark's tasks run (:mod:`spark_jobs.jobs.tasks`, free of ``pyspark``), on a small
thread pool: file reads and Parquet writes release the GIL, and on object storage a write
is a request's latency. The commit is the action's :class:`~spark_jobs.table.action.Transaction`.

What it cannot reproduce exactly -- a key or partition column whose text form only Spark
defines, a JSON or CSV source into a new table (Spark's schema inference), the tee -- raises
:class:`EngineUnsupportedError` before anything is written, so ``--engine auto`` runs Spark.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.arrow_engine.keys import bucket_ids, file_group_slots, partition_dirs, record_keys
from spark_jobs.arrow_engine.source import cast_to_table, read_source, spark_schema
from spark_jobs.exceptions import BadInputError, EngineUnsupportedError
from spark_jobs.kernels import tasks
from spark_jobs.table.action import upsert as action
from spark_jobs.table.action.upsert import (
    DEL,
    DELETE,
    FOUND,
    KEY,
    MOVE_IN,
    MOVE_OUT,
    OLD_FID,
    OLD_PART,
    OP,
    PART,
    TFID,
    TPART,
    UPSERT,
    Attempt,
    Phases,
    PreparedBatch,
    UpsertOptions,
    check_source_columns,
    file_group_entry,
    plan_new_file_groups,
)
from spark_jobs.table.config import INDEX_BUCKET, INDEX_RECORD, TableConfig
from spark_jobs.table.layout import legacy_partition_aliases
from spark_jobs.table.ordering import older, ranks, sort_key
from spark_jobs.table.reader import read_slice
from spark_jobs.table.schema import evolve, refuse_kind_changes, text_fixed_columns
from spark_jobs.table.schema import carried_columns, check_batch_columns, refuse_missing_columns
from spark_jobs.table.view import FileSystemView
from spark_jobs.text import plural

__all__ = ["ArrowUpsertEngine", "run_upsert"]

log = logging.getLogger("bucketindex.upsert")

#: threads for file-group merges, index lookups and index deltas (I/O bound: reads, writes, markers)
THREADS = max(2, min(8, 2 * (os.cpu_count() or 1)))


def run_upsert(opts: UpsertOptions, *, choice: Any = None) -> dict[str, Any]:
    """Upsert one batch in-process (:func:`spark_jobs.table.action.upsert.run`)."""
    return action.run(ArrowUpsertEngine(), opts, choice=choice)


class ArrowUpsertEngine:
    """The upsert's phases on Arrow tables in this process."""

    name = "arrow"

    def session_start_ms(self) -> int | None:
        return None

    def release(self, batch: PreparedBatch | None) -> None:
        return None

    # -- validate and dedupe ---------------------------------------------------------
    def prepare(self, opts: UpsertOptions, cfg: TableConfig, view: FileSystemView | None,
                phases: Phases) -> PreparedBatch:
        if opts.shadow_index is not None:
            raise EngineUnsupportedError("the tee (--shadow-index) runs on the Spark engine")
        if opts.source_df is not None and not isinstance(opts.source_df, pa.Table):
            raise EngineUnsupportedError("the batch was given as a Spark DataFrame")
        table_schema = view.schema if view is not None else None
        raw = opts.source_df if opts.source_df is not None else read_source(
            opts.source, opts.source_format, table_schema=table_schema)
        cols = raw.column_names
        delete_type = _spark_simple_name(raw.schema.field(opts.delete_field).type) \
            if opts.delete_field in cols else None
        data_cols = check_source_columns(cfg=cfg, delete_field=opts.delete_field, columns=cols,
                                         delete_type=delete_type)
        missing: list[str] = []
        if table_schema is not None:
            # the schema the batch writes: the table's, evolved as --schema-evolution allows (the rule
            # is schema.evolve's, which the Spark engine and the pre-check apply too); a column whose
            # shape changed is bad input on every engine, never "decided by Spark alone"
            refuse_kind_changes(table_schema=table_schema, batch_schema=raw.select(data_cols).schema,
                                delete_field=opts.delete_field)
            data_schema = evolve(table_schema, spark_schema(raw.select(data_cols).schema), modes=opts.evolution_modes,
                                 delete_field=opts.delete_field, text_fixed=text_fixed_columns(cfg))
            missing = check_batch_columns(table_columns=[n for n in data_schema.names if n != KEY],
                                          batch_columns=cols, delete_field=opts.delete_field)
            missing = [c for c in missing if c not in opts.absent_columns]  # added concurrently: null
            if missing and not opts.delete_field:
                # every row writes values
                refuse_missing_columns(missing=missing, non_delete_rows=1, partial_update=opts.partial_update)
        else:
            data_schema = spark_schema(raw.select(data_cols).schema).append(pa.field(KEY, pa.string()))
        # the row checks, in the Spark engine's order: empty, bad keys, missing columns, casts
        if raw.num_rows == 0:
            raise BadInputError(f"the batch at {opts.source} is empty")
        bad = _bad_key_rows(raw, cfg.record_key_fields)
        if bad:
            raise BadInputError(f"{bad} row(s) have a null or empty record key ({','.join(cfg.record_key_fields)})")
        deletes = _delete_flags(raw, opts.delete_field)
        if missing:
            refuse_missing_columns(missing=missing, non_delete_rows=int(raw.num_rows - np.count_nonzero(deletes)),
                                   partial_update=opts.partial_update)
        user = pa.schema([f for f in data_schema if f.name != KEY])
        cast = cast_to_table(raw.select([c for c in data_cols if c in user.names]), user)
        keys = record_keys(cast, cfg.record_key_fields)
        parts = partition_dirs(cast, cfg.partition_fields)
        phases.done("validate", defer=True)
        # the order of tie-breaks is the source row as the Spark engine holds it: the table's
        # columns (cast), then the delete field as read; a new table's: the source's columns
        if table_schema is not None:
            order_cols = [cast.column(n) for n in user.names] + ([raw.column(opts.delete_field)]
                                                                 if opts.delete_field else [])
        else:
            order_cols = [cast.column(c) if c in user.names else raw.column(c) for c in cols]
        pre = cast.column(cfg.precombine_field) if cfg.precombine_field else None
        identity = pc.binary_join_element_wise(parts, keys, "\x00") if cfg.index_type == INDEX_BUCKET else keys
        keep = _dedupe(identity, pre, order_cols, any(_has_map(c.type) for c in order_cols))
        frame = cast.append_column(KEY, keys).select(data_schema.names)
        frame = frame.append_column(DEL, pa.array(deletes)).append_column(PART, parts)
        frame = frame.take(pa.array(keep))
        frame = _keep_legacy_dirs(frame, cfg, view)
        n = frame.num_rows
        upserts = int(n - np.count_nonzero(frame.column(DEL).to_numpy(zero_copy_only=False)))
        phases.done("dedupe", plural(n, "distinct key"))
        # the columns the batch holds (a column added concurrently, which it lacks, is not carried either)
        carried = carried_columns(table_columns=[n for n in data_schema.names if n != KEY],
                                  missing=[n for n in data_schema.names if n != KEY and n not in cols],
                                  partial_update=opts.partial_update)
        return PreparedBatch(frame=frame, n=n, upserts=upserts, data_schema=data_schema, rows=raw.num_rows,
                             carried=carried, base_schema=table_schema)

    # -- tag, route, write, index ----------------------------------------------------
    def write(self, attempt: Attempt) -> dict[str, Any]:
        a = attempt
        cfg, view, table = a.cfg, a.view, a.table
        batch: pa.Table = a.batch.frame.combine_chunks()
        keys = batch.column(KEY).combine_chunks()
        if cfg.index_type == INDEX_BUCKET:
            old_part = old_fid = pa.nulls(batch.num_rows, pa.string())
        else:
            old_part, old_fid = self._tag(table, cfg, view, a.num_buckets, keys)
        tagged = batch.append_column(OLD_PART, old_part).append_column(OLD_FID, old_fid)
        stats = _tag_stats(tagged) if cfg.index_type != INDEX_BUCKET else {}
        found = sum(s["found"] for s in stats.values())
        a.phases.done("tag", "routed by hash (bucket index: nothing to look up)" if cfg.index_type == INDEX_BUCKET
                      else f"{plural(found, 'key')} found in the table")
        actions, decided = self._route(table, cfg, view, a.num_buckets, tagged, stats, batch_id=a.batch_id,
                                       carried=a.batch.carried)
        names = a.batch.data_schema.names
        actions = actions.select([*names, OP, FOUND, TPART, TFID])
        ctx = tasks.MergeContext(
            table_uri=table.uri,
            instant=a.instant,
            schema=a.batch.data_schema,
            base_files={f"{p}\x00{f}": s.path for (p, f), s in view.file_groups.items()},
            precombine=cfg.precombine_field,
            emit_index=cfg.index_type == INDEX_RECORD,
            snapshot_seq=a.planned_seq,
            log_files={f"{p}\x00{f}": [lf.path for lf in s.logs] for (p, f), s in view.file_groups.items() if s.logs},
            carried=a.batch.carried,
        )
        task = tasks.append_log if cfg.merge_on_read else tasks.merge_file_group
        groups = _groups(actions, [TPART, TFID])

        def merge(i: int, group: tuple[tuple[str, str], pa.Table]) -> pa.Table:
            (part, fid), rows = group
            own = tasks.MergeContext(**{**ctx.__dict__, "write_token": f"{i}-arrow{a.number}-0"})
            return task((pa.scalar(part, pa.string()), pa.scalar(fid, pa.string())), rows, ctx=own)

        outputs = _parallel(merge, groups)
        merged = pa.concat_tables(outputs) if outputs else tasks._merge_schema().empty_table()
        is_file = pc.equal(merged.column("kind"), "file")
        files = merged.filter(is_file).to_pylist()
        logs = sum(1 for f in files if f["path"] and f["log"])
        a.phases.done("write", plural(sum(1 for f in files if f['path'] and not f['log']), "data file")
                      + (f", {plural(logs, 'log')}" if cfg.merge_on_read else ""))
        index_added: list[dict[str, Any]] = []
        if cfg.index_type == INDEX_RECORD:
            entries = merged.filter(pc.equal(merged.column("kind"), "index")).select(["key", "part", "fid", "tomb"])
            buckets = bucket_ids(entries.column("key").combine_chunks(), a.num_buckets)
            entries = entries.append_column("bucket", pa.array(buckets.astype(np.int32)))

            def delta(group: tuple[tuple[int], pa.Table]) -> pa.Table:
                (bucket,), rows = group
                return tasks.write_index_delta((pa.scalar(bucket, pa.int32()),), rows, table_uri=table.uri,
                                               instant=a.instant, snapshot_seq=a.planned_seq)

            written = _parallel(lambda _, g: delta(g), _groups(entries, ["bucket"]))
            index_added = [{"bucket": r["bucket"], "path": r["path"], "entries": r["entries"], "size": r["size"],
                            "kind": "delta"} for w in written for r in w.to_pylist()]
            a.phases.done("index", plural(len(index_added), "index delta"))
        # rows decided without writing (the action's rule: action.read_set): the merges' and the routing's
        reads = pa.concat_tables([merged.filter(pc.equal(merged.column("kind"), action.READ))
                                  .select(["key", "part", "fid"]), decided])
        read_files: list[dict[str, Any]] = []
        if action.needs_read_files(cfg.index_type) and reads.num_rows:
            rb = bucket_ids(reads.column("key").combine_chunks(), a.num_buckets)
            by_bucket = reads.select(["key"]).append_column("bucket", pa.array(rb.astype(np.int32)))
            read_files = [r for w in _parallel(
                lambda _, g: tasks.write_index_reads((pa.scalar(g[0][0], pa.int32()),), g[1], table_uri=table.uri,
                                                     instant=a.instant, snapshot_seq=a.planned_seq),
                _groups(by_bucket, ["bucket"])) for r in w.to_pylist()]
        counts = {k: sum(int(f[k] or 0) for f in files) for k in ("inserted", "updated", "deleted")}
        counts["moved"] = sum(s["moved"] for s in stats.values())
        return {
            "file_groups": [file_group_entry(f) for f in files if f["path"] or not f["log"]],
            "index": {"added": index_added, "removed": []},
            "counts": counts,
            "num_buckets": a.num_buckets,
            **action.read_set(index_type=cfg.index_type, read_files=read_files,
                              groups=zip(reads.column("part").to_pylist(), reads.column("fid").to_pylist())),
        }

    def _tag(self, table: Any, cfg: TableConfig, view: FileSystemView, num_buckets: int,
             keys: pa.Array) -> tuple[pa.Array, pa.Array]:
        """Each key's current (partition, file id); nulls for new keys."""
        if cfg.index_type == INDEX_RECORD:
            files = {b: list(f) for b, f in view.index_files.items() if f}
            found: list[pa.Table] = []
            if files:
                buckets = bucket_ids(keys, num_buckets)
                wanted = [(int(b),) for b in np.unique(buckets) if int(b) in files]
                by_bucket = {b: pa.table({KEY: keys.filter(pa.array(buckets == b))}) for (b,) in wanted}

                def look(_: int, b: tuple[int]) -> pa.Table:
                    return tasks.lookup_bucket((pa.scalar(b[0], pa.int32()),), by_bucket[b[0]],
                                               table_uri=table.uri, files=files)

                found = _parallel(look, wanted)
        else:  # global_simple: every live key of the snapshot
            slices = view.slices()
            found = []
            if slices:
                listing = pa.RecordBatch.from_pylist(
                    [{"path": s.path, "part": s.partition, "fid": s.file_id, "logs": [lf.path for lf in s.logs]}
                     for s in slices],
                    schema=pa.schema([("path", pa.string()), ("part", pa.string()), ("fid", pa.string()),
                                      ("logs", pa.list_(pa.string()))]))
                # a group whose rows were all deleted has an empty base (compaction keeps it for
                # later logs): its file yields no batch, so the schema is given
                found = [pa.Table.from_batches(
                    list(tasks.read_file_keys([listing], table_uri=table.uri, part=OLD_PART, fid=OLD_FID)),
                    schema=pa.schema([(KEY, pa.string()), (OLD_PART, pa.string()), (OLD_FID, pa.string())]))]
        hits = [t for t in found if t.num_rows]
        if not hits:
            nulls = pa.nulls(len(keys), pa.string())
            return nulls, nulls
        where = pa.concat_tables(hits)
        pos = pc.index_in(keys, value_set=where.column(KEY).combine_chunks())
        return (pc.take(where.column(OLD_PART), pos).combine_chunks(),
                pc.take(where.column(OLD_FID), pos).combine_chunks())

    def _route(self, table: Any, cfg: TableConfig, view: FileSystemView, num_buckets: int, tagged: pa.Table,
               stats: dict[str, dict[str, int]], *, batch_id: str, carried: list[str] | None = None
               ) -> tuple[pa.Table, pa.Table]:
        """One row per action with its target file group (TPART, TFID), OP and FOUND, and the rows
        the routing decided without writing (``key``, ``part``, ``fid``: deletes of absent keys
        with nulls, stale moves with the group holding the stored row). A key of a
        ``--partial-update`` batch (``carried``) moving partitions takes the stored values of the
        columns the batch lacks from its old file group (format.md §8)."""
        is_del = tagged.column(DEL)
        if cfg.index_type == INDEX_BUCKET:  # a group's merge decides (tasks' read rows)
            buckets = bucket_ids(tagged.column(KEY).combine_chunks(), num_buckets)
            return (tagged.append_column(TPART, tagged.column(PART))
                    .append_column(TFID, pc.utf8_lpad(pa.array(buckets).cast(pa.string()), 8, "0"))
                    .append_column(OP, pc.if_else(is_del, DELETE, UPSERT))
                    .append_column(FOUND, pa.nulls(tagged.num_rows, pa.bool_()))), _decided(tagged.slice(0, 0))
        exists = pc.is_valid(tagged.column(OLD_FID))
        decided = [_decided(tagged.filter(pc.and_(pc.invert(exists), is_del)))]  # deletes of absent keys
        moved = _moved(tagged)
        if cfg.precombine_field and any(s["moved"] for s in stats.values()):
            before = tagged
            tagged, moved = _drop_stale_moves(table, cfg, view, tagged, moved)
            stale = pc.invert(pc.is_in(before.column(KEY), value_set=tagged.column(KEY).combine_chunks()))
            decided.append(_decided(before.filter(stale)))
            exists = pc.is_valid(tagged.column(OLD_FID))
            is_del = tagged.column(DEL)
        if carried is not None and pc.any(moved).as_py():
            tagged = _fetch_moved(table, cfg, view, tagged, moved, carried)
        in_place = tagged.filter(pc.and_(exists, pc.invert(moved)))
        in_place = (in_place.append_column(OP, pc.if_else(in_place.column(DEL), DELETE, UPSERT))
                    .append_column(TPART, in_place.column(OLD_PART)).append_column(TFID, in_place.column(OLD_FID))
                    .append_column(FOUND, pa.array(np.ones(in_place.num_rows, bool))))
        move_out = tagged.filter(moved)
        move_out = (move_out.append_column(OP, pa.array([MOVE_OUT] * move_out.num_rows, pa.string()))
                    .append_column(TPART, move_out.column(OLD_PART)).append_column(TFID, move_out.column(OLD_FID))
                    .append_column(FOUND, pa.array(np.ones(move_out.num_rows, bool))))
        entering_mask = pc.or_(moved, pc.and_(pc.invert(exists), pc.invert(is_del)))
        entering = tagged.filter(entering_mask)
        entering_moved = pc.filter(moved, entering_mask)
        entering = _assign_new_file_groups(cfg, view, entering,
                                           {p: s["entering"] for p, s in stats.items() if s["entering"]},
                                           batch_id=batch_id)
        entering = (entering.append_column(OP, pc.if_else(entering_moved, MOVE_IN, UPSERT))
                    .append_column(FOUND, pa.array(np.zeros(entering.num_rows, bool))))
        cols = in_place.column_names
        return pa.concat_tables([in_place, move_out.select(cols), entering.select(cols)]), pa.concat_tables(decided)


# -- rules executed on Arrow ---------------------------------------------------------------
def _spark_simple_name(t: pa.DataType) -> str:
    """Spark's simple name of a column type, for the rules that speak in it (the delete field)."""
    names = {pa.bool_(): "boolean", pa.string(): "string", pa.large_string(): "string", pa.int8(): "tinyint",
             pa.int16(): "smallint", pa.int32(): "int", pa.int64(): "bigint", pa.float32(): "float",
             pa.float64(): "double", pa.date32(): "date"}
    if pa.types.is_dictionary(t):
        return _spark_simple_name(t.value_type)
    return names.get(t, str(t))


def _bad_key_rows(raw: pa.Table, fields: list[str]) -> int:
    """Rows whose record key is null (any field null) or empty (one string field holding "")."""
    bad = np.zeros(raw.num_rows, dtype=bool)
    for f in fields:
        bad |= raw.column(f).is_null().to_numpy(zero_copy_only=False)
    if len(fields) == 1:
        col = raw.column(fields[0])
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            bad |= pc.fill_null(pc.equal(col, ""), False).to_numpy(zero_copy_only=False)
    return int(np.count_nonzero(bad))


_TRUE, _FALSE = {"t", "true", "y", "yes", "1"}, {"f", "false", "n", "no", "0"}


def _delete_flags(raw: pa.Table, field: str | None) -> np.ndarray:
    """Whether each row deletes its key: Spark's ``cast(field as boolean)``, null as no."""
    if not field:
        return np.zeros(raw.num_rows, dtype=bool)
    col = raw.column(field)
    if pa.types.is_boolean(col.type):
        return pc.fill_null(col, False).to_numpy(zero_copy_only=False)
    if pa.types.is_integer(col.type):
        return pc.fill_null(pc.not_equal(col, 0), False).to_numpy(zero_copy_only=False)
    out = np.zeros(raw.num_rows, dtype=bool)
    bad = []
    for i, v in enumerate(col.to_pylist()):
        if v is None:
            continue
        text = v.strip().lower()
        if text in _TRUE:
            out[i] = True
        elif text not in _FALSE:
            bad.append(v)
    if bad:
        raise action.not_a_delete_flag(field, min(bad))
    return out


def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_map(t.value_type)
    if pa.types.is_struct(t):
        return any(_has_map(t.field(i).type) for i in range(t.num_fields))
    return False


def _dedupe(identity: pa.Array | pa.ChunkedArray, precombine: Any, order_cols: list[Any], has_map: bool) -> np.ndarray:
    """Row positions of the winner of each identity, in first-seen order (action rule: highest
    precombine value in format.md §8's order -- nulls lowest, NaN highest, -0.0 equal to 0.0;
    then the greatest source row compared column by column as Spark orders structs).
    Identities seen once need no comparison."""
    if isinstance(identity, pa.ChunkedArray):
        identity = identity.combine_chunks()
    codes = pc.dictionary_encode(identity).indices.to_numpy(zero_copy_only=False)
    counts = np.bincount(codes)
    if counts.size == 0 or counts.max() <= 1:
        return np.arange(len(codes))
    dup_rows = np.nonzero(counts[codes] > 1)[0]
    winners: dict[int, int] = {}
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
    for code, (_, j) in best.items():
        winners[code] = int(dup_rows[j])
    keep = np.nonzero(counts[codes] == 1)[0]
    return np.sort(np.concatenate([keep, np.fromiter(winners.values(), dtype=np.int64, count=len(winners))]))


def _keep_legacy_dirs(frame: pa.Table, cfg: TableConfig, view: FileSystemView | None) -> pa.Table:
    """A value whose directory an older table named by the older rule stays there (format.md §1)."""
    if view is None or not cfg.partition_fields:
        return frame
    aliases = legacy_partition_aliases(field=cfg.partition_fields[0], partitions={p for p, _ in view.file_groups})
    if not aliases:
        return frame
    parts = frame.column(PART).to_pylist()
    i = frame.column_names.index(PART)
    return frame.set_column(i, PART, pa.array([aliases.get(p, p) for p in parts], pa.string()))


def _decided(rows: pa.Table) -> pa.Table:
    """Rows decided without writing as (key, part, fid): the group holding the stored row, or
    nulls for a key the snapshot does not hold (``action.read_set``)."""
    return pa.table({"key": rows.column(KEY).combine_chunks().cast(pa.string()),
                     "part": rows.column(OLD_PART).combine_chunks().cast(pa.string()),
                     "fid": rows.column(OLD_FID).combine_chunks().cast(pa.string())})


def _moved(tagged: pa.Table) -> Any:
    """Known keys, not deleted, whose partition value changed (global indexes)."""
    exists = pc.is_valid(tagged.column(OLD_FID))
    changed = pc.fill_null(pc.not_equal(tagged.column(OLD_PART), tagged.column(PART)), False)
    return pc.and_(pc.and_(exists, pc.invert(tagged.column(DEL))), changed)


def _tag_stats(tagged: pa.Table) -> dict[str, dict[str, int]]:
    """Per partition: keys found in the table, keys moving in, rows entering."""
    exists = pc.is_valid(tagged.column(OLD_FID)).to_numpy(zero_copy_only=False)
    moved = _as_numpy(_moved(tagged))
    entering = moved | (~exists & ~_as_numpy(tagged.column(DEL)))
    encoded = tagged.column(PART).combine_chunks().dictionary_encode()
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    parts = encoded.dictionary.to_pylist()
    sums = {name: np.bincount(codes, weights=v, minlength=len(parts)).astype(np.int64).tolist()
            for name, v in (("found", exists), ("moved", moved), ("entering", entering))}
    return {p: {k: sums[k][i] for k in sums} for i, p in enumerate(parts)}


def _as_numpy(a: Any) -> np.ndarray:
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    return a.to_numpy(zero_copy_only=False).astype(bool)


def _drop_stale_moves(table: Any, cfg: TableConfig, view: FileSystemView, tagged: pa.Table,
                      moved: pa.Array) -> tuple[pa.Table, pa.Array]:
    """A key moving partitions is compared with its stored row first; read only the slices holding movers."""
    movers = tagged.filter(moved)
    holders = set(zip(movers.column(OLD_PART).to_pylist(), movers.column(OLD_FID).to_pylist()))
    slices = [view.file_groups[h] for h in sorted(holders) if h in view.file_groups]
    if not slices:
        return tagged, moved
    pcf = cfg.precombine_field
    stored = pa.concat_tables([
        read_slice(table, s.path, [lf.path for lf in s.logs], columns=[KEY, pcf], precombine=pcf,
                   schema=view.schema).select([KEY, pcf])
        for s in slices])
    pos = pc.index_in(tagged.column(KEY), value_set=stored.column(KEY).combine_chunks())
    prev = pc.take(stored.column(pcf), pos)
    stale = pc.and_(pc.and_(moved, pc.is_valid(prev)), older(tagged.column(pcf), prev))  # format.md §8's order
    keep = pc.invert(pc.fill_null(stale, False))
    return tagged.filter(keep), pc.filter(moved, keep)


def _fetch_moved(table: Any, cfg: TableConfig, view: FileSystemView, tagged: pa.Table, moved: Any,
                 carried: list[str]) -> pa.Table:
    """Keys of a partial batch moving partitions, with the stored values of the columns the batch
    lacks (read from the slices holding them): the row entering the new partition is whole."""
    assert view.schema is not None
    movers = tagged.filter(moved)
    holders = set(zip(movers.column(OLD_PART).to_pylist(), movers.column(OLD_FID).to_pylist()))
    slices = [view.file_groups[h] for h in sorted(holders) if h in view.file_groups]
    lacking = [n for n in view.schema.names if n != KEY and n not in carried]
    if not slices or not lacking:
        return tagged
    stored = pa.concat_tables([
        read_slice(table, s.path, [lf.path for lf in s.logs], columns=[KEY, *lacking], precombine=cfg.precombine_field,
                   schema=view.schema).select([KEY, *lacking])
        for s in slices])
    pos = pc.index_in(tagged.column(KEY), value_set=stored.column(KEY).combine_chunks())
    for name in lacking:
        i = tagged.column_names.index(name)
        fetched = pc.if_else(moved, pc.take(stored.column(name), pos), tagged.column(name))
        tagged = tagged.set_column(i, tagged.schema.field(name), fetched)
    return tagged


def _assign_new_file_groups(cfg: TableConfig, view: FileSystemView, rows: pa.Table,
                            counts: dict[str, int], *, batch_id: str) -> pa.Table:
    """Rows entering a partition with their planned file group (the action's plan; the slot hash is Spark's)."""
    ranges = plan_new_file_groups(cfg, view, counts, batch_id=batch_id)
    tfid = np.full(rows.num_rows, None, dtype=object)
    if ranges and rows.num_rows:
        parts = np.asarray(rows.column(PART).to_pylist(), dtype=object)
        sizes = np.asarray([counts.get(p, 0) for p in parts.tolist()], dtype=np.int64)
        slots = file_group_slots(rows.column(KEY).combine_chunks(), sizes)
        by_part: dict[str, list[tuple[int, str]]] = {}
        for part, fid, lo, _hi, _n in ranges:  # each partition's ranges are contiguous from slot 0
            by_part.setdefault(part, []).append((lo, fid))
        for part, planned in by_part.items():
            here = np.nonzero(parts == part)[0]
            los = np.asarray([lo for lo, _ in planned], dtype=np.int64)
            fids = np.asarray([f for _, f in planned], dtype=object)
            tfid[here] = fids[np.searchsorted(los, slots[here], side="right") - 1]
    return rows.append_column(TPART, rows.column(PART)).append_column(TFID, pa.array(tfid.tolist(), pa.string()))


def _groups(t: pa.Table, by: list[str]) -> list[tuple[tuple, pa.Table]]:
    """``t`` split by the values of ``by``, in sorted order of those values (a deterministic plan)."""
    n = t.num_rows
    if n == 0:
        return []
    s = t.take(pc.sort_indices(t, sort_keys=[(c, "ascending") for c in by]))
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    for c in by:  # a group starts where any key column differs from the row before (null equals null)
        col = s.column(c).combine_chunks()
        if n > 1:
            prev, cur = col.slice(0, n - 1), col.slice(1)
            nulls_differ = pc.not_equal(pc.is_null(prev), pc.is_null(cur))
            differ = pc.or_(pc.fill_null(pc.not_equal(prev, cur), False), nulls_differ)
            starts[1:] |= differ.to_numpy(zero_copy_only=False)
    bounds = [*np.nonzero(starts)[0].tolist(), n]
    cols = [s.column(c) for c in by]
    return [(tuple(col[lo].as_py() for col in cols), s.slice(lo, hi - lo)) for lo, hi in zip(bounds, bounds[1:])]


def _parallel(fn: Callable[[int, Any], pa.Table], items: Iterable[Any]) -> list[pa.Table]:
    """``fn(i, item)`` for every item on the engine's threads; the first error wins, in item order."""
    items = list(items)
    if len(items) <= 1:
        return [fn(i, x) for i, x in enumerate(items)]
    with ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="bucketindex") as pool:
        futures = [pool.submit(fn, i, x) for i, x in enumerate(items)]
        return [f.result() for f in futures]

