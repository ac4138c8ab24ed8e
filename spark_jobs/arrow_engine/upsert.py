"""The upsert in-process: :mod:`spark_jobs.table.action.upsert` executed on Arrow tables.

The batch is read by pyarrow, validated, cast and deduplicated under the action's rules
(:mod:`spark_jobs.table.action.upsert_rules`, evaluated here with pyarrow compute as the
primitives); tagging, routing, the file-group plan and the tee (``--shadow-index``) are pyarrow
compute and numpy; each touched file
group is merged (or gets its log) and each touched index bucket gets its delta by the same
functions Spark's tasks run (:mod:`spark_jobs.kernels.tasks`, free of ``pyspark``), on a small
thread pool: file reads and Parquet writes release the GIL, and on object storage a write
is a request's latency. The commit is the action's :class:`~spark_jobs.table.action.Transaction`.

What it cannot reproduce exactly -- a key or partition column whose text form only Spark
defines, a JSON or CSV source into a new table (Spark's schema inference) -- raises
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

from spark_jobs.arrow_engine.compact import AUTO_CHOICE, write_plan
from spark_jobs.arrow_engine.keys import bucket_ids, by_bucket, file_group_slots, partition_dirs, record_keys
from spark_jobs.arrow_engine.source import cast_to_table, read_source, spark_schema
from spark_jobs.exceptions import BadInputError, EngineUnsupportedError
from spark_jobs.io.arrays import from_numpy
from spark_jobs.kernels import tasks
from spark_jobs.table.action import upsert as action
from spark_jobs.table.action import upsert_rules as rules
from spark_jobs.table.action.upsert import (
    DEL,
    FOUND,
    KEY,
    OLD_FID,
    OLD_PART,
    OP,
    PART,
    TFID,
    TEE_KINDS,
    TPART,
    Attempt,
    Phases,
    PreparedBatch,
    UpsertOptions,
    check_source_columns,
    plan_new_file_groups,
)
from spark_jobs.table.commit import Written
from spark_jobs.table.config import INDEX_BUCKET, INDEX_RECORD, TableConfig
from spark_jobs.table.ordering import older
from spark_jobs.table.reader import read_slice
from spark_jobs.table.schema import evolve, refuse_kind_changes, text_fixed_columns
from spark_jobs.table.schema import carried_columns, check_batch_columns, refuse_missing_columns
from spark_jobs.table.view import FileSystemView
from spark_jobs.text import plural

__all__ = ["ArrowUpsertEngine", "run_upsert", "needed_bytes", "table_bytes", "BATCH_HOLD", "ROW_BYTES",
           "PROCESS_BYTES"]

log = logging.getLogger("bucketindex.upsert")

#: threads for file-group merges, index lookups and index deltas (I/O bound: reads, writes, markers)
THREADS = max(2, min(8, 2 * (os.cpu_count() or 1)))

# -- how much the upsert holds (issue 38, item 5) --------------------------------------------
# The budget is the process's peak RSS: what ``--memory-budget`` says to set "below the memory
# this process may use". Measured (cold CLI, ``--engine arrow``, record index, copy-on-write, a
# new table unless noted; the kernel's high-water mark ``/usr/bin/time -f %M``, or RSS polled
# every 100 ms by benchmarks/memory_bounds.py; 2 cores, load 2-8), after the batch was made to be
# held fewer times (no cast or dedupe copy when nothing changes, sorted copies made column by
# column):
#
#   rows  data                                  decoded   peak RSS
#   200k  narrow: 5 columns, 13-byte keys        9.7 MiB   278 MiB
#   1M    narrow                                48.8 MiB   676 MiB
#   200k  benchmark rows: 9 columns, UUIDs      19.5 MiB   332 MiB
#   1M    benchmark rows                        97.0 MiB   829 MiB (polled); 884 MiB into a 1M table
#   3M    benchmark rows                         291 MiB  1977 MiB (polled); 1790 MiB into a 3M table
#
# Fitted: ~180-210 MiB fixed + ~390 B a row (the columns the engine adds: record key, partition,
# tags, target file groups, ops, index entries, sort orders, dedupe's hash table) + ~2.5 x the
# decoded batch (as read, kept for a retry; its routed copy, sorted; the merges' output). Before
# those changes the same 1M / 3M loads peaked at 1134 / 3131 MiB against estimates of 400 / 1198
# MiB (source bytes x 6 + file groups + an index bucket), and a 10M-row load at 10.9 GB against
# 2.6 GiB. The constants below round the fit up (8-25 % above every measured peak).
#: the process before and beside the data: interpreter, pyarrow, numpy, the engine's threads and
#: the allocator's arenas (the fit's intercept; a cold 10-row upsert peaks at 97 MiB)
PROCESS_BYTES = 224 << 20
#: bytes held at the peak per row of the batch, whatever its width (the columns the engine adds)
ROW_BYTES = 448
#: bytes held at the peak per byte of the decoded batch (Arrow's ``nbytes``)
BATCH_HOLD = 3


def needed_bytes(*, rows: int, batch_bytes: int, table_bytes: int) -> int:
    """The process's peak, planned: :data:`PROCESS_BYTES` + :data:`ROW_BYTES` a row +
    :data:`BATCH_HOLD` x the decoded batch + ``table_bytes`` (:func:`table_bytes`: what the upsert
    reads of the table beside the batch). An upper bound of the measured peaks (above), so a run
    within its budget stays within it; ``auto`` sizes with the batch's estimated size, the engine
    checks again with its exact size once it has read it."""
    return PROCESS_BYTES + ROW_BYTES * max(0, rows) + BATCH_HOLD * max(0, batch_bytes) + max(0, table_bytes)


#: in-memory bytes per live key a global_simple tag holds (key text, partition, file id)
KEY_BYTES = 96
#: in-memory bytes per record-index entry a lookup holds (fingerprints, location codes)
INDEX_ENTRY_BYTES = 64
#: bytes held per byte of a file group merged (its Parquet file's size): the base decoded, the
#: merged result, the writer's buffers, and the allocator's per-thread heaps (mimalloc keeps what
#: a merge thread freed). Measured: a 10k-row batch of updates into a 4.5M-row copy-on-write
#: table (45 groups of 6.7 MiB, 4 merged at once; 16 buckets) peaked at 460-491 MiB, ~250 MiB of
#: it for the merges and the mapped index: 8.9 x the 4 groups' bytes (planned at 6 x, without the
#: mapped index: a 410 MiB estimate; now 599 MiB)
GROUP_HOLD = 10
#: bytes of record-index file per entry (sizing.md section 3: 17.9-19.3 after compaction)
INDEX_FILE_BYTES = 19


def table_bytes(*, index_type: str, view: FileSystemView | None, num_buckets: int) -> int:
    """What the upsert holds of the table beside the batch, at worst: the largest file groups it
    may merge at once (one per thread, :data:`GROUP_HOLD` x their bytes), and for ``record`` one
    bucket's entries looked up plus the index files the lookups map -- every touched bucket's
    file stays mapped in the process's open-file cache, up to its bound
    (``record_index.CACHE_MAX_BYTES``), and their pages count in the process's RSS -- or for
    ``global_simple`` every key of the snapshot."""
    from spark_jobs.table.config import INDEX_GLOBAL_SIMPLE

    if view is None:
        return 0
    largest = sorted((s.total_size for s in view.file_groups.values()), reverse=True)[:THREADS]
    groups = sum(largest) * GROUP_HOLD
    if index_type == INDEX_GLOBAL_SIMPLE:
        return groups + view.num_rows * KEY_BYTES
    if index_type == INDEX_RECORD:
        from spark_jobs.index.record_index import CACHE_MAX_BYTES

        mapped = min(view.num_rows * INDEX_FILE_BYTES, CACHE_MAX_BYTES)
        return groups + mapped + view.num_rows // max(1, num_buckets) * INDEX_ENTRY_BYTES
    return groups


def run_upsert(opts: UpsertOptions, *, choice: Any = None, announce: bool = True) -> dict[str, Any]:
    """Upsert one batch in-process (:func:`spark_jobs.table.action.upsert.run`; ``announce=False``:
    the caller has logged the engine choice). A ``choice`` with a budget holds the run to it
    (:class:`ArrowUpsertEngine`)."""
    return action.run(ArrowUpsertEngine(budget=getattr(choice, "budget", None)), opts, choice=choice,
                      announce=announce, compact=lambda table, plan: (write_plan, AUTO_CHOICE))


def refuse_over_budget(raw: pa.Table, *, what: str, budget: int, table_bytes: int) -> None:
    """Raise :class:`EngineUnsupportedError` (``auto`` then runs Spark; nothing is written yet)
    when ``raw``, read whole, puts the run's planned peak (:func:`needed_bytes`, its exact
    decoded size) over ``budget``: the estimate the engine was chosen by came from footers,
    which a column of repeated values (dictionary pages) under-states."""
    from spark_jobs.table.action.engine import BUDGET_SETTING, human_size

    need = needed_bytes(rows=raw.num_rows, batch_bytes=raw.nbytes, table_bytes=table_bytes)
    if need > budget:
        raise EngineUnsupportedError(
            f"{what} ({plural(raw.num_rows, 'row')}) decodes to {human_size(raw.nbytes)} in memory, about "
            f"{human_size(need)} at the arrow engine's peak, over the {human_size(budget)} budget that "
            f"{BUDGET_SETTING} sets")


class ArrowUpsertEngine:
    """The upsert's phases on Arrow tables in this process.

    ``budget``: bytes the run is held to (:attr:`EngineChoice.budget`). The whole batch is held in
    memory -- deduplication, the routing of new keys to file groups and the one atomic commit are
    decided over all of it -- so a batch whose planned peak (:func:`needed_bytes`, with the exact
    decoded size read) is over the budget is never attempted: it is refused right after the read,
    before anything is written, with :class:`EngineUnsupportedError` -- ``--engine auto`` then
    runs it on Spark (one log line says why), ``--engine arrow`` with a budget fails with one line
    (exit 2). Streaming the batch in budget-sized slices would need a second pass for dedupe
    and routing and several writes per file group; Spark is the engine built for that, and a
    scheduled task that runs out of memory half-way helps nobody.
    """

    name = "arrow"

    def __init__(self, *, budget: int | None = None) -> None:
        self.budget = budget

    def session_start_ms(self) -> int | None:
        return None

    def release(self, batch: PreparedBatch | None) -> None:
        return None

    # -- validate and dedupe ---------------------------------------------------------
    def prepare(self, opts: UpsertOptions, cfg: TableConfig, view: FileSystemView | None,
                phases: Phases) -> PreparedBatch:
        if opts.source_df is not None and not isinstance(opts.source_df, pa.Table):
            raise EngineUnsupportedError("the batch was given as a Spark DataFrame")
        table_schema = view.schema if view is not None else None
        raw = opts.source_df if opts.source_df is not None else read_source(
            opts.source, opts.source_format, table_schema=table_schema)
        if self.budget is not None and opts.source_df is None:
            self._check_budget(raw, cfg, view)
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
        source_names = [*user.names, *([opts.delete_field] if opts.delete_field else [])] \
            if table_schema is not None else cols
        lead, row = rules.dedupe_order(cfg, source_names)
        n_cast = len(user.names) if table_schema is not None else len(row)
        order_cols = [cast.column(c) if i < n_cast and c in user.names else raw.column(c) for i, c in enumerate(row)]
        pre = cast.column(lead[0]) if lead else None
        ident = [{PART: parts, KEY: keys}[c] for c in rules.identity_columns(cfg)]
        identity = ident[0] if len(ident) == 1 else pc.binary_join_element_wise(*ident, "\x00")
        keep = rules.dedupe_winners(identity, pre, order_cols, any(_has_map(c.type) for c in order_cols))
        del identity, order_cols, pre
        frame = cast.append_column(KEY, keys).select(data_schema.names)
        frame = frame.append_column(DEL, from_numpy(deletes)).append_column(PART, parts)
        if len(keep) < frame.num_rows:  # a batch without duplicates is kept as read: no copy of it
            frame = frame.take(pa.array(keep))
        frame = _renamed_partitions(frame, rules.legacy_aliases(cfg, view))
        n = frame.num_rows
        upserts = int(n - np.count_nonzero(frame.column(DEL).to_numpy(zero_copy_only=False)))
        phases.done("dedupe", plural(n, "distinct key"))
        # the columns the batch holds (a column added concurrently, which it lacks, is not carried either)
        carried = carried_columns(table_columns=[n for n in data_schema.names if n != KEY],
                                  missing=[n for n in data_schema.names if n != KEY and n not in cols],
                                  partial_update=opts.partial_update)
        return PreparedBatch(frame=frame, n=n, upserts=upserts, data_schema=data_schema, rows=raw.num_rows,
                             carried=carried, base_schema=table_schema)

    def _check_budget(self, raw: pa.Table, cfg: TableConfig, view: FileSystemView | None) -> None:
        """Refuse (EngineUnsupportedError, nothing written) a batch whose planned peak with its
        exact decoded size is over :attr:`budget`: the estimate ``auto`` chose by was made from the
        source's footers, which a column of repeated values (dictionary pages) under-states."""
        assert self.budget is not None
        num_buckets = (view.num_buckets if view is not None else None) or cfg.num_buckets
        refuse_over_budget(raw, what="the batch", budget=self.budget,
                           table_bytes=table_bytes(index_type=cfg.index_type, view=view, num_buckets=num_buckets))

    # -- tag, route, write, index ----------------------------------------------------
    def write(self, attempt: Attempt) -> Written:
        a = attempt
        cfg, view, table = a.cfg, a.view, a.table
        batch: pa.Table = a.batch.frame  # held by the action for a retry: never copied whole here
        keys = batch.column(KEY).combine_chunks()
        if cfg.index_type == INDEX_BUCKET:
            old_part = old_fid = pa.nulls(batch.num_rows, pa.string())
        else:
            old_part, old_fid = self._tag(table, cfg, view, a.num_buckets, keys)
        tagged = batch.append_column(OLD_PART, old_part).append_column(OLD_FID, old_fid)
        stats = _count_per_partition(tagged, rules.TAG_STATS) if cfg.index_type != INDEX_BUCKET else {}
        found = sum(s["found"] for s in stats.values())
        a.phases.done("tag", "routed by hash (bucket index: nothing to look up)" if cfg.index_type == INDEX_BUCKET
                      else f"{plural(found, 'key')} found in the table")
        shadow = None
        if a.shadow_index is not None:
            shadow = _shadow(table, cfg, view, a.num_buckets, tagged, a.shadow_index)
            d = shadow["disagreements"]
            a.phases.done("shadow", f"{a.shadow_index}: {plural(shadow['keys_compared'], 'key')} compared, "
                          + ", ".join(f"{d[k]} {k}" for k in TEE_KINDS))
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
        del tagged, batch, keys, old_part, old_fid
        routed = _Consumed(actions)  # the routed copy is freed column by column as it is sorted
        del actions
        groups = _groups(routed, [TPART, TFID])

        def merge(i: int, group: tuple[tuple[str, str], pa.Table]) -> pa.Table:
            (part, fid), rows = group
            own = tasks.MergeContext(**{**ctx.__dict__, "write_token": f"{i}-arrow{a.number}-0"})
            return task((pa.scalar(part, pa.string()), pa.scalar(fid, pa.string())), rows, ctx=own)

        outputs = _parallel(merge, groups)
        del groups  # the sorted batch: written
        merged = pa.concat_tables(outputs) if outputs else tasks._merge_schema().empty_table()
        del outputs
        is_file = pc.equal(merged.column("kind"), "file")
        files = merged.filter(is_file).to_pylist()
        # rows decided without writing (the action's rule: action.read_set): the merges' and the routing's
        reads = pa.concat_tables([merged.filter(pc.equal(merged.column("kind"), action.READ))
                                  .select(["key", "part", "fid"]), decided])
        entries = merged.filter(pc.equal(merged.column("kind"), "index")).select(["key", "part", "fid", "tomb"]) \
            if cfg.index_type == INDEX_RECORD else None
        del merged, is_file
        logs = sum(1 for f in files if f["path"] and f["log"])
        a.phases.done("write", plural(sum(1 for f in files if f['path'] and not f['log']), "data file")
                      + (f", {plural(logs, 'log')}" if cfg.merge_on_read else ""))
        index_added: list[dict[str, Any]] = []
        if entries is not None:
            buckets = bucket_ids(entries.column("key").combine_chunks(), a.num_buckets)
            entries = entries.append_column("bucket", from_numpy(buckets.astype(np.int32)))
            del buckets

            def delta(group: tuple[tuple[int], pa.Table]) -> pa.Table:
                (bucket,), rows = group
                return tasks.write_index_delta((pa.scalar(bucket, pa.int32()),), rows, table_uri=table.uri,
                                               instant=a.instant, snapshot_seq=a.planned_seq)

            consumed = _Consumed(entries)
            del entries
            by_bucket_groups = _groups(consumed, ["bucket"])
            written = _parallel(lambda _, g: delta(g), by_bucket_groups)
            del by_bucket_groups
            index_added = [r for w in written for r in w.to_pylist()]
            a.phases.done("index", plural(len(index_added), "index delta"))
        read_files: list[dict[str, Any]] = []
        if action.needs_read_files(cfg.index_type) and reads.num_rows:
            rb = bucket_ids(reads.column("key").combine_chunks(), a.num_buckets)
            read_keys = reads.select(["key"]).append_column("bucket", from_numpy(rb.astype(np.int32)))
            read_files = [r for w in _parallel(
                lambda _, g: tasks.write_index_reads((pa.scalar(g[0][0], pa.int32()),), g[1], table_uri=table.uri,
                                                     instant=a.instant, snapshot_seq=a.planned_seq),
                _groups(read_keys, ["bucket"])) for r in w.to_pylist()]
        counts = {k: sum(int(f[k] or 0) for f in files) for k in ("inserted", "updated", "deleted")}
        counts["moved"] = sum(s["moved"] for s in stats.values())
        return action.attempt_written(
            files=files, index_deltas=index_added, counts=counts, num_buckets=a.num_buckets, shadow=shadow,
            reads=action.read_set(index_type=cfg.index_type, read_files=read_files,
                                  groups=zip(reads.column("part").to_pylist(), reads.column("fid").to_pylist())))

    def _tag(self, table: Any, cfg: TableConfig, view: FileSystemView, num_buckets: int,
             keys: pa.Array) -> tuple[pa.Array, pa.Array]:
        """Each key's current (partition, file id); nulls for new keys."""
        if cfg.index_type == INDEX_RECORD:
            files = {b: list(f) for b, f in view.index_files.items() if f}
            found: list[pa.Table] = []
            if files:
                grouped = {b: pa.table({KEY: k}) for b, k in by_bucket(keys, bucket_ids(keys, num_buckets))
                           if b in files}

                def look(_: int, b: int) -> pa.Table:
                    return tasks.lookup_bucket((pa.scalar(b, pa.int32()),), grouped[b],
                                               table_uri=table.uri, files=files)

                found = _parallel(look, list(grouped))
        else:  # global_simple: every live key of the snapshot
            found = [_scan_keys(table, view, part=OLD_PART, fid=OLD_FID)]
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
        with nulls, stale moves with the group holding the stored row): the action's routes
        (:func:`~spark_jobs.table.action.upsert_rules.routes`) executed on Arrow tables. A key of
        a ``--partial-update`` batch (``carried``) moving partitions takes the stored values of
        the columns the batch lacks from its old file group (format.md §8)."""
        decided = [_decided(tagged.slice(0, 0))]  # the bucket index: a group's merge decides (tasks' read rows)
        if cfg.index_type != INDEX_BUCKET:
            decided = [_decided(tagged.filter(_ArrowOps(tagged).is_true(rules.absent_delete(_ArrowOps(tagged)))))]
            tagged = tagged.append_column(rules.MOVED, rules.moved(_ArrowOps(tagged)))
            if cfg.precombine_field and rules.any_moved(stats):
                tagged, stale = _drop_stale_moves(table, cfg, view, tagged)
                decided.append(_decided(stale))
            if carried is not None and pc.any(tagged.column(rules.MOVED)).as_py():
                tagged = _fetch_moved(table, cfg, view, tagged, carried)
        streams = []
        for route in rules.routes(cfg.index_type):
            rows = tagged.filter(_ArrowOps(tagged).is_true(route.where(_ArrowOps(tagged))))
            n = rows.num_rows
            if route.target == rules.OLD:
                tpart, tfid = rows.column(OLD_PART), rows.column(OLD_FID)
            elif route.target == rules.NEW:
                tpart = rows.column(PART)
                tfid = _new_file_groups(cfg, view, rows, rules.entering_counts(stats), batch_id=batch_id)
            else:  # rules.BY_HASH
                tpart = rows.column(PART)
                tfid = pc.utf8_lpad(pa.array(bucket_ids(rows.column(KEY).combine_chunks(), num_buckets))
                                    .cast(pa.string()), 8, "0")
            found = pa.nulls(n, pa.bool_()) if route.found is None else from_numpy(np.full(n, route.found, bool))
            streams.append(rows.append_column(OP, _full(route.op(_ArrowOps(rows)), n))
                           .append_column(TPART, tpart).append_column(TFID, tfid).append_column(FOUND, found))
        cols = streams[0].column_names
        return pa.concat_tables([t.select(cols) for t in streams]), pa.concat_tables(decided)


def _scan_keys(table: Any, view: FileSystemView, *, part: str, fid: str) -> pa.Table:
    """Every live key of the snapshot with its location (``part``, ``fid``), as the Spark engine's
    key scan (``jobs.read.keys_with_location``) reads it."""
    schema = pa.schema([(KEY, pa.string()), (part, pa.string()), (fid, pa.string())])
    slices = view.slices()
    if not slices:
        return schema.empty_table()
    listing = pa.RecordBatch.from_pylist(
        [{"path": s.path, "part": s.partition, "fid": s.file_id, "logs": [lf.path for lf in s.logs]} for s in slices],
        schema=pa.schema([("path", pa.string()), ("part", pa.string()), ("fid", pa.string()),
                          ("logs", pa.list_(pa.string()))]))
    # a group whose rows were all deleted has an empty base (compaction keeps it for later logs):
    # its file yields no batch, so the schema is given
    return pa.Table.from_batches(list(tasks.read_file_keys([listing], table_uri=table.uri, part=part, fid=fid)),
                                 schema=schema)


def _shadow(table: Any, cfg: TableConfig, view: FileSystemView, num_buckets: int, tagged: pa.Table,
            shadow_index: str) -> dict[str, Any]:
    """The tee (``--shadow-index``; the rules: ``rules.tee_row``, ``rules.tee_kind``): the table's
    tagging compared with ``shadow_index``'s per key of the batch, the shadow's answer read by a key
    scan of the snapshot (a hash join in-process). Nothing written changes."""
    from spark_jobs.table.shadow import SAMPLES  # here: only a tee needs the shadow module

    keys = tagged.column(KEY).combine_chunks()
    if cfg.index_type == INDEX_BUCKET:  # the index's answer: hash % N in the row's partition, for every key
        fids = pc.utf8_lpad(pa.array(bucket_ids(keys, num_buckets)).cast(pa.string()), 8, "0")
        own = pa.table({KEY: keys, PART: tagged.column(PART), OLD_PART: tagged.column(PART), OLD_FID: fids})
    else:
        own = tagged.select([KEY, PART, OLD_PART, OLD_FID])
    joined = own.join(_scan_keys(table, view, part=rules.SH_PART, fid=rules.SH_FID), KEY, join_type="left outer")
    ids = rules.tee_identity(cfg.index_type)
    found = rules.tee_row(_ArrowOps(joined), index_type=cfg.index_type, shadow_index=shadow_index)
    names = (rules.TEE_OWN, rules.TEE_SH, rules.TEE_SAME)
    rows = pa.table({**{c: joined.column(c) for c in ids}, **dict(zip(names, found))})
    # a key the scan finds twice (a duplicated key in the data) agrees when any of its rows does
    agg = rows.group_by(ids).aggregate([(n, "any") for n in names])
    per_key = pa.table({**{c: agg.column(c) for c in ids}, **{n: agg.column(f"{n}_any") for n in names}})
    kind = rules.tee_kind(_ArrowOps(per_key), index_type=cfg.index_type)
    out: dict[str, tuple[int, list[str]]] = {}
    for k in TEE_KINDS:
        hits = per_key.filter(pc.equal(kind, k)).column(KEY).to_pylist()
        if hits:
            out[k] = (len(hits), sorted(hits)[:SAMPLES])
    return rules.tee_report(shadow_index=shadow_index, index_type=cfg.index_type, keys_compared=tagged.num_rows,
                            found=out, kinds=TEE_KINDS, samples=SAMPLES)


class _ArrowOps:
    """The rules' column primitives (:class:`~spark_jobs.table.action.upsert_rules.Ops`) over one table."""

    def __init__(self, t: pa.Table) -> None:
        self.t = t

    def col(self, name: str) -> Any:
        return self.t.column(name)

    def lit(self, value: Any) -> pa.Scalar:
        return pa.scalar(value)

    def valid(self, x: Any) -> Any:
        return pc.is_valid(x)

    def and_(self, a: Any, b: Any) -> Any:
        return pc.and_(a, b)

    def or_(self, a: Any, b: Any) -> Any:
        return pc.or_(a, b)

    def not_(self, a: Any) -> Any:
        return pc.invert(a)

    def differ(self, a: Any, b: Any) -> Any:
        return pc.fill_null(pc.not_equal(a, b), False)

    def same(self, a: Any, b: Any) -> Any:
        return pc.fill_null(pc.equal(a, b), False)

    def if_else(self, cond: Any, a: Any, b: Any) -> Any:
        return pc.if_else(cond, a, b)

    def older(self, incoming: Any, stored: Any) -> Any:
        return older(incoming, stored)

    def is_true(self, x: Any) -> Any:
        if isinstance(x, pa.Scalar):
            return pa.array(np.full(self.t.num_rows, bool(x.as_py())))
        return pc.fill_null(x, False)


def _full(x: Any, n: int) -> Any:
    """A rule's value as a column of ``n`` rows (a literal is repeated)."""
    return pa.array([x.as_py()] * n, x.type) if isinstance(x, pa.Scalar) else x


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


def _renamed_partitions(frame: pa.Table, aliases: dict[str, str]) -> pa.Table:
    """``frame`` with each partition directory in ``aliases`` renamed (the rule: ``rules.legacy_aliases``)."""
    if not aliases:
        return frame
    parts = frame.column(PART).to_pylist()
    i = frame.column_names.index(PART)
    return frame.set_column(i, PART, pa.array([aliases.get(p, p) for p in parts], pa.string()))


def _decided(rows: pa.Table) -> pa.Table:
    """Rows decided without writing, as the action names them (``rules.DECIDED``)."""
    return pa.table({out: rows.column(src).combine_chunks().cast(pa.string()) for out, src in rules.DECIDED})


def _count_per_partition(tagged: pa.Table, counted: Any) -> dict[str, dict[str, int]]:
    """Per partition, how many rows each of ``counted``'s rules holds for (``rules.TAG_STATS``)."""
    o = _ArrowOps(tagged)
    encoded = tagged.column(PART).combine_chunks().dictionary_encode()
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    parts = encoded.dictionary.to_pylist()
    sums = {name: np.bincount(codes, weights=_as_numpy(o.is_true(rule(o))), minlength=len(parts))
            .astype(np.int64).tolist() for name, rule in counted}
    return {p: {k: sums[k][i] for k in sums} for i, p in enumerate(parts)}


def _as_numpy(a: Any) -> np.ndarray:
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    return a.to_numpy(zero_copy_only=False).astype(bool)


def _movers(tagged: pa.Table) -> set[tuple[str, str]]:
    movers = tagged.filter(tagged.column(rules.MOVED))
    return set(zip(movers.column(OLD_PART).to_pylist(), movers.column(OLD_FID).to_pylist()))


def _drop_stale_moves(table: Any, cfg: TableConfig, view: FileSystemView, tagged: pa.Table
                      ) -> tuple[pa.Table, pa.Table]:
    """``tagged`` without its stale moves (``rules.stale_move``), and those moves; reads only
    the slices holding movers."""
    slices = rules.mover_slices(view, _movers(tagged))
    if not slices:
        return tagged, tagged.slice(0, 0)
    pcf = cfg.precombine_field
    stored = pa.concat_tables([
        read_slice(table, s.path, [lf.path for lf in s.logs], columns=[KEY, pcf], precombine=pcf,
                   schema=view.schema).select([KEY, pcf])
        for s in slices])
    pos = pc.index_in(tagged.column(KEY), value_set=stored.column(KEY).combine_chunks())
    stale = rules.stale_move(_ArrowOps(tagged), precombine=pcf, stored=pc.take(stored.column(pcf), pos))
    return tagged.filter(pc.invert(stale)), tagged.filter(stale)


def _fetch_moved(table: Any, cfg: TableConfig, view: FileSystemView, tagged: pa.Table,
                 carried: list[str]) -> pa.Table:
    """Movers of a partial batch with the stored values of the columns the batch lacks
    (``rules.lacking_columns``), read from the slices holding them."""
    slices = rules.mover_slices(view, _movers(tagged))
    lacking = rules.lacking_columns(view, carried)
    if not slices or not lacking:
        return tagged
    stored = pa.concat_tables([
        read_slice(table, s.path, [lf.path for lf in s.logs], columns=[KEY, *lacking], precombine=cfg.precombine_field,
                   schema=view.schema).select([KEY, *lacking])
        for s in slices])
    pos = pc.index_in(tagged.column(KEY), value_set=stored.column(KEY).combine_chunks())
    moved = tagged.column(rules.MOVED)
    for name in lacking:
        i = tagged.column_names.index(name)
        fetched = pc.if_else(moved, pc.take(stored.column(name), pos), tagged.column(name))
        tagged = tagged.set_column(i, tagged.schema.field(name), fetched)
    return tagged


def _new_file_groups(cfg: TableConfig, view: FileSystemView, rows: pa.Table,
                     counts: dict[str, int], *, batch_id: str) -> pa.Array:
    """The planned file group of each row entering a partition: the action's plan
    (``plan_new_file_groups``), a slot by the Spark hash, the range holding it by ``searchsorted``."""
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
    return pa.array(tfid.tolist(), pa.string())


class _Consumed:
    """A table handed to :func:`_groups` to be consumed: its columns are released one by one as
    their sorted copies are made, so sorting holds the table once plus one column, not twice
    (the caller drops its own reference before the groups are used)."""

    def __init__(self, t: pa.Table) -> None:
        self.t: pa.Table | None = t


def _groups(t: "pa.Table | _Consumed", by: list[str]) -> list[tuple[tuple, pa.Table]]:
    """``t`` split by the values of ``by``, in sorted order of those values (a deterministic plan).
    A :class:`_Consumed` table is released column by column while it is sorted."""
    if isinstance(t, _Consumed):
        assert t.t is not None
        src, t.t = t.t, None
        n = src.num_rows
        if n == 0:
            return []
        order = pc.sort_indices(src, sort_keys=[(c, "ascending") for c in by])
        schema = src.schema
        cols = list(src.columns)
        del src
        for i in range(len(cols)):  # each column's sorted copy replaces it: one column extra at a time
            cols[i] = cols[i].take(order)
        s = pa.Table.from_arrays(cols, schema=schema)
        del cols, order
    else:
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

