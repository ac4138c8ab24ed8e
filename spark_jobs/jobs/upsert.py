"""The upsert on Spark: the engine that executes :mod:`spark_jobs.table.action.upsert` with DataFrames.

The action module holds the phases and the protocol, and :mod:`spark_jobs.table.action.upsert_rules`
the rules (evaluated here as Spark Column expressions); this module executes the
validate/dedupe and tag/route/write phases as Spark jobs, for batches that need a cluster
(the in-process engine is :mod:`spark_jobs.arrow_engine.upsert`).

**Tee** (``shadow_index``, ``--shadow-index global_simple|bucket``; RFC-08's rollout period):
after the tag phase, the batch's keys are also tagged by a second index computed on the fly,
and the two answers are compared per key of the batch in one extra Spark job; the result goes
to the commit metadata under ``shadow`` (format.md §3.3). The table's own tagging alone routes
the write: the comparison is a separate query over the persisted tagged batch, so nothing
written changes. The words are ``shadow-compare``'s (:mod:`spark_jobs.table.shadow`), with the
table's index as "the index" and the shadow index as the truth: *missing* -- the shadow index
finds the key, the table's index does not; *extra* -- the table's index finds it, the shadow
does not; *wrong_location* -- both find it, in different places. Per table index:

* record, ``global_simple``: a key scan of the snapshot (the join ``global_simple`` tables tag
  with); partition and file group are compared.
* record, ``bucket``: a hash index computed on the fly answers file group ``hash(key) mod N``,
  which a record table's file groups are not; as in ``shadow-compare --against bucket``, the
  answer is the key scan's and only the partition (and presence) is compared.
* bucket, ``global_simple``: the bucket index's answer for a row is file group ``hash(key) mod
  N`` of the row's partition (a hash index answers every key: nothing is missing or extra);
  the scan's answer is where the key lives in that partition (the identity is per partition,
  so rows of the key in other partitions are not compared); a different file group is a
  *wrong_location*.
* Refused (BadInputError, before anything is written): the table's own index type (compared
  with itself) and ``bucket`` on a global_simple table (its file groups are not hash buckets).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from spark_jobs.exceptions import BadInputError
from spark_jobs.kernels import tasks
from spark_jobs.jobs.compact import auto_pick
from spark_jobs.jobs.keys import aliased_partition_expr, bucket_expr, file_id_for_bucket_expr, key_expr, partition_expr
from spark_jobs.jobs.read import keys_with_location, read_slices
from spark_jobs.jobs.session import default_parallelism, job_conf, session_start_ms
from spark_jobs.jobs.source import (
    castability_checks,
    corrupt_file_message,
    raise_uncastable,
    read_source,
    source_bytes,
)
from spark_jobs.resources import shuffle_partitions
from spark_jobs.table.action import upsert as action
from spark_jobs.table.action import upsert_rules as rules
from spark_jobs.table.action.upsert import (
    DEL,
    FILE_GROUP_SALT,
    OLD_FID,
    OLD_PART,
    PART,
    TEE_KINDS,
    TFID,
    TPART,
    Attempt,
    Phases,
    PreparedBatch,
    UpsertOptions,
    check_shadow_index,
    check_source_columns,
    plan_new_file_groups,
)
from spark_jobs.table.commit import Written
from spark_jobs.table.config import INDEX_BUCKET, INDEX_RECORD, TableConfig
from spark_jobs.table.schema import evolve, refuse_kind_changes, text_fixed_columns
from spark_jobs.table.schema import STORED_TZ, carried_columns, check_batch_columns, refuse_missing_columns
from spark_jobs.table.shadow import SAMPLES
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView
from spark_jobs.text import plural

__all__ = ["UpsertOptions", "run_upsert", "SparkUpsertEngine", "check_shadow_index"]

log = logging.getLogger("bucketindex.upsert")

KEY, OP = tasks.KEY, tasks.OP
BUCKET = "_bi_bucket"


def _validated_batch(
    spark: SparkSession, opts: UpsertOptions, cfg: TableConfig, view: FileSystemView | None
) -> tuple[DataFrame, Any, "_BatchChecks"]:
    """The source as a DataFrame in the table's column order, the data schema, and the row-level
    checks to raise after the first query over it; raises BadInputError for schema problems."""
    df = raw = opts.source_df if opts.source_df is not None else read_source(
        spark, opts.source, opts.source_format, table_schema=view.schema if view is not None else None)
    cols = df.columns
    delete_type = raw.schema[opts.delete_field].dataType.simpleString() if opts.delete_field in cols else None
    data_cols = check_source_columns(cfg=cfg, delete_field=opts.delete_field, columns=cols, delete_type=delete_type)
    target, cast_checks, missing = None, [], []
    evolved = None
    if view is not None and view.schema is not None:
        # the column rules (spark_jobs.table.schema): a new column or a wider type only as
        # --schema-evolution allows (schema.evolve, as the Arrow engine and the pre-check);
        # a missing one only if every row deletes
        stored = _stored_schema(raw, data_cols, view.schema)
        refuse_kind_changes(table_schema=view.schema, batch_schema=stored, delete_field=opts.delete_field)
        evolved = evolve(view.schema, stored, modes=opts.evolution_modes,
                         delete_field=opts.delete_field, text_fixed=text_fixed_columns(cfg))
        missing = check_batch_columns(table_columns=[n for n in evolved.names if n != KEY], batch_columns=cols,
                                      delete_field=opts.delete_field)
        missing = [c for c in missing if c not in opts.absent_columns]  # added concurrently: null
        if missing and not opts.delete_field:
            # every row writes values
            refuse_missing_columns(missing=missing, non_delete_rows=1, partial_update=opts.partial_update)
        target = from_arrow_schema(evolved)
        cast_checks = castability_checks(raw, target)
    # The row-level checks (empty batch, null keys, values that cannot be cast) run as
    # observed metrics of the dedupe query instead of a query of their own: one pass over
    # the source, and a cold JVM pays a second or more per query. Castability is observed
    # on the source values, before the cast.
    key = key_expr(cfg.record_key_fields)
    observation = Observation("bucketindex_batch_checks")
    df = raw.observe(
        observation,
        F.count(F.lit(1)).alias("n"),
        F.coalesce(F.sum((key.isNull() | (key == "")).cast("long")), F.lit(0)).alias("bad_keys"),
        *[agg for _, agg in cast_checks],
        # rows that write values, counted only when the batch lacks columns (a batch of deletes may)
        *([F.coalesce(F.sum((~_is_delete(opts.delete_field)).cast("long")), F.lit(0)).alias("non_delete")]
          if missing else []),
        # a string delete field: the smallest value that is not a boolean (the arrow engine names the same)
        *([F.min(F.when(F.col(opts.delete_field).isNotNull() & F.col(opts.delete_field).try_cast("boolean").isNull(),
                        F.col(opts.delete_field))).alias("bad_delete")] if delete_type == "string" else []),
    )
    if target is not None:
        # try_cast: a value that cannot be cast fails the observed checks, whose error names
        # the column; an ANSI cast error would end the query with a stack trace instead. A
        # column the batch lacks is null: only a batch of deletes gets here, and writes no values, or
        # a --partial-update batch, whose write keeps the stored values instead (tasks.MergeContext.carried)
        df = df.select(
            *[(F.col(f.name).try_cast(f.dataType) if f.name in cols else F.lit(None).cast(f.dataType)).alias(f.name)
              for f in target.fields if f.name != KEY],
            *([F.col(opts.delete_field)] if opts.delete_field else []),
        )
        data_schema = evolved
    else:
        data_schema = None
    checks = _BatchChecks(observation, raw, target, [name for name, _ in cast_checks], cfg.record_key_fields,
                          opts.source, missing, partial_update=opts.partial_update, delete_field=opts.delete_field,
                          # the columns the batch holds (one added concurrently, which it lacks, is not carried)
                          carried=carried_columns(table_columns=[n for n in evolved.names if n != KEY],
                                                  missing=[n for n in evolved.names if n != KEY and n not in cols],
                                                  partial_update=opts.partial_update)
                          if evolved is not None else None)
    if data_schema is None:
        data_schema = to_arrow_schema(raw.select(*data_cols, key.alias(KEY)).schema, timezone=STORED_TZ)
    return df, data_schema, checks


def _stored_schema(raw: DataFrame, data_cols: list[str], table_schema: Any) -> Any:
    """The batch's data columns as Arrow types (Spark's, zone-aware timestamps in UTC): what
    ``schema.evolve`` compares with the table's. A type Arrow cannot hold keeps the table's
    type for a column the table has (the cast then decides), and is bad input for a new one."""
    import pyarrow as pa

    fields = []
    for name in data_cols:
        f = raw.schema[name]
        try:
            fields.append(to_arrow_schema(T.StructType([f]), timezone=STORED_TZ).field(0))
        except Exception:  # noqa: BLE001 - pyspark raises several kinds for types Arrow lacks
            if name not in table_schema.names:
                raise BadInputError(f"column {name!r} of type {f.dataType.simpleString()} cannot be stored") from None
            fields.append(table_schema.field(name))
    return pa.schema(fields)


@dataclass
class _BatchChecks:
    """The batch's row-level checks, observed while the dedupe query runs (see :func:`_validated_batch`)."""

    observation: Observation
    raw: DataFrame
    target: Any
    cast_columns: list[str]
    key_fields: list[str]
    source: str
    #: the table's columns the batch lacks (allowed only when every row is a delete, or partial_update)
    missing: list[str] = field(default_factory=list)
    partial_update: bool = False
    #: ``--partial-update``: the user columns the batch carries (None: all)
    carried: list[str] | None = None
    #: the delete field (named by its observed check)
    delete_field: str | None = None

    def raise_if_bad(self) -> None:
        try:
            stats = self.observation.get
        except Exception:
            # a source with no rows can have no partitions (an empty Parquet file: no row
            # groups), so the observed node ran in no task and Spark has no metrics row to give
            # (an assertion in ``toPyRow``): ask the source itself before reporting anything else
            if self.raw.limit(1).count() == 0:
                raise BadInputError(f"the batch at {self.source} is empty") from None
            raise
        if not stats.get("n"):
            raise BadInputError(f"the batch at {self.source} is empty")
        if stats.get("bad_keys"):
            raise BadInputError(f"{stats['bad_keys']} row(s) have a null or empty record key ({','.join(self.key_fields)})")
        if stats.get("bad_delete") is not None:
            raise action.not_a_delete_flag(str(self.delete_field), stats["bad_delete"])
        if self.missing:
            refuse_missing_columns(missing=self.missing, non_delete_rows=int(stats.get("non_delete") or 0),
                                   partial_update=self.partial_update)
        if self.cast_columns:
            raise_uncastable(self.raw, self.target, stats, self.cast_columns)


def run_upsert(spark: SparkSession, opts: UpsertOptions, *, choice: Any = None) -> dict[str, Any]:
    """Upsert one batch on Spark (:func:`spark_jobs.table.action.upsert.run`); returns the instant,
    counts and timings.

    Raises BadInputError on bad input (nothing written), ConflictError when concurrent
    commits kept conflicting, InstantRolledBackError when a forced rollback aborted it.
    """
    return action.run(SparkUpsertEngine(spark), opts, choice=choice, compact=auto_pick(spark))


class SparkUpsertEngine:
    """The upsert's phases as Spark jobs over one session."""

    name = "spark"

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.cores = default_parallelism(spark)

    def session_start_ms(self) -> int | None:
        return session_start_ms()

    def prepare(self, opts: UpsertOptions, cfg: TableConfig, view: FileSystemView | None,
                phases: Phases) -> PreparedBatch:
        df, data_schema, checks = _validated_batch(self.spark, opts, cfg, view)
        phases.done("validate", defer=True)  # the row checks run with the dedupe query
        # dedupe and the batch's row checks in one query, before anything is written. Persisted
        # inside the settings: a cached plan keeps the shuffle partitions it was planned with,
        # and every later stage over the batch runs one task per cached partition
        partitions = shuffle_partitions(source_bytes(opts.source), self.cores)
        cached: list[DataFrame] = []
        try:
            with job_conf(self.spark, **{"spark.sql.shuffle.partitions": partitions}):
                batch, n, upserts, cached = _dedupe(df, cfg, opts.delete_field, rules.legacy_aliases(cfg, view),
                                                    partitions=partitions, checks=checks)
            rows = int(checks.observation.get.get("n") or 0)  # read from the source, before dedupe
        except BaseException as e:
            for c in cached:
                _unpersist(c)
            corrupt = corrupt_file_message(e) if isinstance(e, Exception) else None
            if corrupt is not None:  # a directory's junk file surfaces here, at the batch's first scan of it
                raise BadInputError(f"{corrupt}; nothing was written") from e
            raise
        phases.done("dedupe", plural(n, "distinct key"))
        return _SparkBatch(frame=batch, n=n, upserts=upserts, data_schema=data_schema, rows=rows,
                           carried=checks.carried, base_schema=view.schema if view is not None else None,
                           cached=cached, partitions=partitions)

    def write(self, attempt: Attempt) -> Written:
        b = attempt.batch
        return _write(self.spark, attempt.table, attempt.cfg, attempt.view, attempt.num_buckets, b.frame, b.n,
                      b.upserts, b.data_schema, attempt.instant, attempt.phases, self.cores,
                      batch_partitions=b.partitions if isinstance(b, _SparkBatch) else None,
                      planned_seq=attempt.planned_seq, shadow_index=attempt.shadow_index, batch_id=attempt.batch_id,
                      carried=b.carried)

    def release(self, batch: PreparedBatch | None) -> None:
        if batch is None:
            return
        if isinstance(batch, _SparkBatch):
            cached, batch.cached = batch.cached, []  # a second release frees nothing twice
        else:
            cached = [batch.frame]
        for c in cached:
            _unpersist(c)


@dataclass
class _SparkBatch(PreparedBatch):
    """A batch :meth:`SparkUpsertEngine.prepare` made: what it holds travels with it, so no
    engine-side map keyed by a frame's ``id()`` (which a later frame may reuse) can hand one
    batch's cache to another."""

    #: the persisted frames the batch is read from (:meth:`SparkUpsertEngine.release` unpersists them)
    cached: list[DataFrame] = field(default_factory=list)
    #: the partitions the frame is hash-partitioned into by identity (:func:`_dedupe`), which the
    #: tag's join reuses (:func:`_tag`); None: unknown
    partitions: int | None = None


def _shadow(spark: SparkSession, table: Table, cfg: TableConfig, view: FileSystemView, num_buckets: int,
            tagged: DataFrame, n: int, shadow_index: str) -> dict[str, Any]:
    """The tee (module doc; the rules: ``rules.tee_row``, ``rules.tee_kind``): compare the table's
    tagging with ``shadow_index``'s, per key of the batch.

    One Spark job over the persisted ``tagged`` batch joined with the snapshot's key scan (the
    join :func:`_scan_join` tags global_simple tables with); ``tagged`` itself is not changed.
    """
    if cfg.index_type == INDEX_BUCKET:  # the index's answer: hash % N in the row's partition, for every key
        own = tagged.select(KEY, PART, F.col(PART).alias(OLD_PART),
                            file_id_for_bucket_expr(bucket_expr(F.col(KEY), num_buckets)).alias(OLD_FID))
    else:
        own = tagged.select(KEY, PART, OLD_PART, OLD_FID)
    joined = _scan_join(spark, table, view, own, part=rules.SH_PART, fid=rules.SH_FID)
    if joined is None:  # an empty table: the scan finds nothing
        joined = own.withColumn(rules.SH_PART, F.lit(None).cast("string")).withColumn(
            rules.SH_FID, F.lit(None).cast("string"))
    found = rules.tee_row(_OPS, index_type=cfg.index_type, shadow_index=shadow_index)
    # a key the scan finds twice (a duplicated key in the data) agrees when any of its rows does
    per_key = joined.groupBy(*rules.tee_identity(cfg.index_type)).agg(
        *[F.max(c).alias(name) for c, name in zip(found, (rules.TEE_OWN, rules.TEE_SH, rules.TEE_SAME))])
    rows = per_key.withColumn("kind", rules.tee_kind(_OPS, index_type=cfg.index_type)).filter(
        F.col("kind") != F.lit(rules.AGREE)).groupBy("kind").agg(
        F.count(F.lit(1)).alias("count"), F.slice(F.sort_array(F.collect_list(KEY)), 1, SAMPLES).alias("samples")
    ).collect()
    return rules.tee_report(shadow_index=shadow_index, index_type=cfg.index_type, keys_compared=n,
                            found={r["kind"]: (int(r["count"]), list(r["samples"])) for r in rows},
                            kinds=TEE_KINDS, samples=SAMPLES)


def _unpersist(df: DataFrame) -> None:
    try:
        df.unpersist()
    except Exception:  # noqa: BLE001 - a dead JVM must not hide the error that killed it
        log.debug("could not unpersist the batch", exc_info=True)


def _is_delete(delete_field: str | None) -> Column:
    """Whether a source row deletes its key (null counts as no): the one reading of the delete field."""
    # try_cast: a string that is not a boolean is refused by the observed checks (``bad_delete``),
    # not by an ANSI cast error mid-query
    return F.coalesce(F.col(delete_field).try_cast("boolean"), F.lit(False)) if delete_field else F.lit(False)


def _dedupe(df: DataFrame, cfg: TableConfig, delete_field: str | None, aliases: dict[str, str], *,
            partitions: int, checks: "_BatchChecks") -> tuple[DataFrame, int, int, list[DataFrame]]:
    """One row per identity (``rules.identity_columns``), the greatest in ``rules.dedupe_order``
    (the precombine value, then the source row; format.md §8); returns the batch, its identities,
    its upserts and the persisted frames it is read from. Raises the batch's row checks
    (``checks``) after the first query, before any other.

    Why not one ``max_by`` aggregation over the source: the order (a struct of the row) is no
    mutable aggregation buffer, so Spark plans a ``SortAggregate`` that sorts the whole batch twice,
    map and reduce side (23% of a 1M-row upsert's job time, docs/benchmarks.md "Spark engine
    profile"); and a window sorts too. Instead the batch is hash-partitioned by its identity
    (one shuffle, no sort; ``partitions`` tasks after it even when the source is one row group)
    and persisted, and the rows per identity are counted over the cache -- a hash aggregate
    that needs no shuffle, since the cache keeps its partitioning. Most batches hold every
    identity once and are kept as they are; a batch with duplicates runs ``max_by`` over the
    cached partitions (no shuffle, one sort). The batch stays partitioned by identity, which
    the tag's join reuses (:func:`_tag`).

    The legacy aliases are applied before the dedupe: old and new names are one-to-one, so
    identities are the same either way, and the order compares source columns only.
    """
    keyed = (
        df.withColumn(KEY, key_expr(cfg.record_key_fields))
        .withColumn(DEL, _is_delete(delete_field))
        .withColumn(PART, partition_expr(cfg.partition_fields))
    )
    if aliases:
        keyed = keyed.withColumn(PART, aliased_partition_expr(F.col(PART), aliases))
    ident = rules.identity_columns(cfg)
    out_cols = [c for c in keyed.columns if c != delete_field]
    upserts_of = [F.coalesce(F.sum((~F.col(DEL)).cast("long")), F.lit(0)).alias("upserts")]
    seen = Observation("bucketindex_batch_rows")
    parted = keyed.repartition(partitions, *ident).observe(seen, *upserts_of).persist(StorageLevel.MEMORY_AND_DISK)
    cached = [parted]
    try:
        per_identity = Observation("bucketindex_identities")
        # one job over the cache (plus the repartition's map stage): builds it, observes the row
        # checks and counts each identity's rows without moving them
        (parted.groupBy(*ident).agg(F.count(F.lit(1)).alias("_bi_rows"))
         .observe(per_identity, F.count(F.lit(1)).alias("ids"), F.max("_bi_rows").alias("most"))
         .write.format("noop").mode("overwrite").save())
        checks.raise_if_bad()
        counted = per_identity.get
        n, most = int(counted.get("ids") or 0), int(counted.get("most") or 0)
        if most <= 1:  # every identity once: the batch as read
            return parted.select(*out_cols), n, int(seen.get.get("upserts") or 0), cached
        lead, row = rules.dedupe_order(cfg, df.columns)
        source_row = F.struct(*[F.col(c) for c in row])
        if any(isinstance(f.dataType, T.MapType) or "map<" in f.dataType.simpleString() for f in df.schema.fields):
            source_row = F.to_json(source_row)  # maps have no order: compare their JSON instead
        order = F.struct(*[F.col(c) for c in lead], source_row)
        rest = [c for c in out_cols if c not in ident]
        # grouped by the identity the cache is partitioned by (no shuffle); the identity columns
        # stay grouping columns, so the winners keep that partitioning
        deduped = Observation("bucketindex_deduped")
        winners = parted.groupBy(*ident).agg(
            F.max_by(F.struct(*[F.col(c) for c in rest]), order).alias("_bi_row")
        ).select(*[F.col(c) if c in ident else F.col(f"_bi_row.{c}").alias(c) for c in out_cols])
        winners = winners.observe(deduped, *upserts_of).persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(winners)
        n = winners.count()
        _unpersist(parted)
        return winners, n, int(deduped.get.get("upserts") or 0), [winners]
    except BaseException:
        for c in cached:
            _unpersist(c)
        raise


def _tag(spark: SparkSession, table: Table, cfg: TableConfig, view: FileSystemView, num_buckets: int,
         batch: DataFrame, *, batch_partitions: int | None = None) -> DataFrame:
    """Add the current location (OLD_PART, OLD_FID) of each key; null for new keys.

    Record index: the lookups' hits (keys and locations only) are hash-partitioned by key into
    ``batch_partitions``, the partitioning :func:`_dedupe` left the batch in, and joined by a
    shuffled hash join: the batch is neither shuffled again nor sorted (a sort-merge join did
    both: a second full shuffle of the batch, 30% of the tag phase's share of a 1M-row upsert)."""
    no_loc = batch.withColumn(OLD_PART, F.lit(None).cast("string")).withColumn(OLD_FID, F.lit(None).cast("string"))
    if cfg.index_type == INDEX_BUCKET:
        return no_loc  # the location is hash % N inside the partition: nothing to read
    if cfg.index_type == INDEX_RECORD:
        files = {b: list(f) for b, f in view.index_files.items() if f}
        if not files:
            return no_loc
        keys = batch.select(KEY, bucket_expr(F.col(KEY), num_buckets).alias(BUCKET)).filter(
            F.col(BUCKET).isin(list(files))
        )
        found = keys.groupBy(BUCKET).applyInArrow(
            tasks.bind(tasks.lookup_bucket, table_uri=table.uri, files=files), tasks.LOOKUP_OUTPUT
        )
        if batch_partitions is None:
            return batch.join(found, KEY, "left")
        # the hits are the build side (at most one per batch key: key and location only)
        return batch.join(found.repartition(batch_partitions, KEY).hint("shuffle_hash"), KEY, "left")
    # global_simple: join against the keys of every live data file (sized from the snapshot)
    joined = _scan_join(spark, table, view, batch, part=OLD_PART, fid=OLD_FID)
    return no_loc if joined is None else joined


def _scan_join(spark: SparkSession, table: Table, view: FileSystemView, batch: DataFrame, *, part: str,
               fid: str) -> DataFrame | None:
    """``batch`` left-joined on the key with every live key's location (``part``, ``fid``); None
    for an empty table. Spark cannot size what a Python task returns (it guesses from the input, a list of a
    few file names), so left to itself it broadcasts every key of the table -- 10M keys failed
    a 4 GiB driver. Decide from the snapshot's row count instead: broadcast only what Spark's
    default threshold allows."""
    existing = keys_with_location(spark, table, view, part=part, fid=fid)
    if existing is None:
        return None
    hint = "broadcast" if view.num_rows * KEY_BYTES <= BROADCAST_KEYS_BYTES else "merge"
    return batch.join(existing.hint(hint), KEY, "left")


def _assign_new_file_groups(spark: SparkSession, cfg: TableConfig, view: FileSystemView, rows: DataFrame,
                            counts: dict[str, int], *, batch_id: str) -> tuple[DataFrame, int]:
    """Give rows entering a partition a file group (the plan: :func:`action.plan_new_file_groups`).

    Returns the rows with TPART/TFID and the number of file groups planned.
    """
    ranges = plan_new_file_groups(cfg, view, counts, batch_id=batch_id)
    if not ranges:
        return rows.withColumn(TPART, F.col(PART)).withColumn(TFID, F.lit(None).cast("string")), 0
    # a hash independent of the index bucket (salted), so file groups do not follow buckets
    hashed = F.xxhash64(F.col(KEY), F.lit(FILE_GROUP_SALT))
    if len(ranges) <= INLINE_PLAN_RANGES:
        # the plan as two CASE expressions: no DataFrame of it, so no aggregate and no broadcasts
        # (each a Spark job of its own, ~1 s of a cold session); a row whose slot no range holds is
        # dropped, as by the joins below
        sizes = {p: n for p, _, _, _, n in ranges}
        slot = None
        for p, n in sizes.items():
            slot = (F.when if slot is None else slot.when)(F.col(PART) == F.lit(p), F.pmod(hashed, F.lit(n)))
        target = None
        for p, fid, lo, hi, _ in ranges:
            hit = (F.col(PART) == F.lit(p)) & (F.col("_bi_slot") >= F.lit(lo)) & (F.col("_bi_slot") < F.lit(hi))
            target = (F.when if target is None else target.when)(hit, F.lit(fid))
        routed = (rows.withColumn("_bi_slot", slot).withColumn(TFID, target).filter(F.col(TFID).isNotNull())
                  .drop("_bi_slot").withColumn(TPART, F.col(PART)))
        return routed, len(ranges)
    plan = spark.createDataFrame(ranges, f"_bi_ppart string, {TFID} string, _bi_lo long, _bi_hi long, _bi_n long")
    sizes = F.broadcast(plan.select(F.col("_bi_ppart").alias(PART), "_bi_n").distinct())
    slot = F.pmod(hashed, F.col("_bi_n"))
    rn = rows.join(sizes, PART).withColumn("_bi_slot", slot).drop("_bi_n")
    routed = (
        rn.join(F.broadcast(plan), (F.col(PART) == F.col("_bi_ppart")) & (F.col("_bi_slot") >= F.col("_bi_lo"))
                & (F.col("_bi_slot") < F.col("_bi_hi")))
        .drop("_bi_ppart", "_bi_slot", "_bi_lo", "_bi_hi", "_bi_n")
        .withColumn(TPART, F.col(PART))
    )
    return routed, len(ranges)


class _SparkOps:
    """The rules' column primitives (:class:`~spark_jobs.table.action.upsert_rules.Ops`) as Spark
    Columns: a rule becomes one native expression, no Python per row."""

    def col(self, name: str) -> Column:
        return F.col(name)

    def lit(self, value: Any) -> Column:
        return F.lit(value)

    def valid(self, x: Column) -> Column:
        return x.isNotNull()

    def and_(self, a: Column, b: Column) -> Column:
        return a & b

    def or_(self, a: Column, b: Column) -> Column:
        return a | b

    def not_(self, a: Column) -> Column:
        return ~a

    def differ(self, a: Column, b: Column) -> Column:
        return F.coalesce(a != b, F.lit(False))

    def same(self, a: Column, b: Column) -> Column:
        return F.coalesce(a == b, F.lit(False))

    def if_else(self, cond: Column, a: Column, b: Column) -> Column:
        return F.when(cond, a).otherwise(b)

    def older(self, incoming: Column, stored: Column) -> Column:
        # SQL's order is format.md §8's: NaN above every number, -0.0 equal to 0.0; null lowest
        return incoming.isNull() | (stored > incoming)

    def is_true(self, x: Column) -> Column:
        return F.coalesce(x, F.lit(False))


_OPS = _SparkOps()


#: a tag count of this engine's besides ``rules.TAG_STATS``: deletes of keys the snapshot lacks
#: (``rules.absent_delete``), so the write knows without a query of its own whether the routing
#: decided rows without writing
ABSENT_DELETES = "_absent_deletes"


def _tag_stats(tagged: DataFrame) -> dict[str, dict[str, int]]:
    """Per partition, the rules' tag counts (``rules.TAG_STATS``) and :data:`ABSENT_DELETES`, in one Spark job."""
    counted = (*rules.TAG_STATS, (ABSENT_DELETES, rules.absent_delete))
    rows = tagged.groupBy(PART).agg(
        *[F.sum(_OPS.is_true(rule(_OPS)).cast("long")).alias(name) for name, rule in counted]).collect()
    return {r[PART]: {name: int(r[name] or 0) for name, _ in counted} for r in rows}


def _route(spark: SparkSession, table: Table, cfg: TableConfig, view: FileSystemView, num_buckets: int,
           tagged: DataFrame, stats: dict[str, dict[str, int]], *, batch_id: str,
           carried: list[str] | None = None) -> tuple[DataFrame, int, DataFrame | None]:
    """One row per action with its target file group (TPART, TFID) and OP, how many file groups it
    targets, and the rows the routing decided without writing (``key``, ``part``, ``fid``: deletes
    of absent keys with nulls, stale moves with the group holding the stored row; None for the
    bucket index, whose merges decide): the action's routes (``rules.routes``) as one plan. A key
    of a ``--partial-update`` batch (``carried``) moving partitions takes the stored values of the
    columns the batch lacks from its old file group (format.md §8)."""
    decided = None
    if cfg.index_type != INDEX_BUCKET:
        decided = _decided(tagged.filter(rules.absent_delete(_OPS)))
        tagged = tagged.withColumn(rules.MOVED, rules.moved(_OPS))
        if cfg.precombine_field and rules.any_moved(stats):
            tagged, stale = _drop_stale_moves(spark, table, cfg, view, tagged)
            if stale is not None:
                decided = decided.unionByName(_decided(stale))
        if carried is not None and rules.any_moved(stats):
            tagged = _fetch_moved(spark, table, view, tagged, carried)
    streams: list[DataFrame] = []
    planned = 0
    for route in rules.routes(cfg.index_type):
        rows = tagged.filter(_OPS.is_true(route.where(_OPS))).withColumn(OP, route.op(_OPS))
        found = F.lit(None).cast("boolean") if route.found is None else F.lit(route.found)
        if route.target == rules.OLD:
            rows = rows.withColumn(TPART, F.col(OLD_PART)).withColumn(TFID, F.col(OLD_FID))
        elif route.target == rules.NEW:
            rows, planned = _assign_new_file_groups(spark, cfg, view, rows, rules.entering_counts(stats),
                                                    batch_id=batch_id)
        else:  # rules.BY_HASH: no lookup (the log writer reads keys)
            rows = rows.withColumn(TPART, F.col(PART)).withColumn(
                TFID, file_id_for_bucket_expr(bucket_expr(F.col(KEY), num_buckets)))
        streams.append(rows.withColumn(tasks.FOUND, found))
    cols = streams[0].columns
    routed = streams[0]
    for more in streams[1:]:
        routed = routed.unionByName(more.select(*cols))
    groups = len(view.file_groups) + (num_buckets if cfg.index_type == INDEX_BUCKET else planned)
    return routed, groups, decided


def _decided(rows: DataFrame) -> DataFrame:
    """Rows decided without writing, as the action names them (``rules.DECIDED``)."""
    return rows.select(*[F.col(src).cast("string").alias(out) for out, src in rules.DECIDED])


def _movers(tagged: DataFrame) -> set[tuple[str, str]]:
    """The (partition, file id) of the groups holding movers' stored rows (one small job)."""
    return {(r[OLD_PART], r[OLD_FID]) for r in
            tagged.filter(F.col(rules.MOVED)).select(OLD_PART, OLD_FID).distinct().collect()}


def _drop_stale_moves(spark: SparkSession, table: Table, cfg: TableConfig, view: FileSystemView,
                      tagged: DataFrame) -> tuple[DataFrame, DataFrame | None]:
    """``tagged`` without its stale moves (``rules.stale_move``), and those moves (None: no
    movers); reads only the files holding movers."""
    holders = _movers(tagged)
    if not holders:
        return tagged, None
    pc = cfg.precombine_field
    stored = read_slices(spark, table, view, rules.mover_slices(view, holders)).select(
        F.col(KEY), F.col(pc).alias("_bi_stored"))
    joined = tagged.join(stored, KEY, "left")
    is_stale = rules.stale_move(_OPS, precombine=pc, stored=F.col("_bi_stored"))
    return joined.filter(~is_stale).drop("_bi_stored"), joined.filter(is_stale).drop("_bi_stored")


def _fetch_moved(spark: SparkSession, table: Table, view: FileSystemView, tagged: DataFrame,
                 carried: list[str]) -> DataFrame:
    """Movers of a partial batch with the stored values of the columns the batch lacks
    (``rules.lacking_columns``), read from the slices holding them."""
    slices = rules.mover_slices(view, _movers(tagged))
    lacking = rules.lacking_columns(view, carried)
    if not slices or not lacking:
        return tagged
    stored = read_slices(spark, table, view, slices).select(
        F.col(KEY), *[F.col(c).alias(f"_bi_stored{i}") for i, c in enumerate(lacking)])
    joined = tagged.join(stored, KEY, "left")
    for i, c in enumerate(lacking):
        joined = joined.withColumn(c, F.when(F.col(rules.MOVED), F.col(f"_bi_stored{i}")).otherwise(F.col(c)))
    return joined.drop(*[f"_bi_stored{i}" for i in range(len(lacking))])


#: bytes of a key and its location in a shuffle, to size global_simple's join with every key
KEY_BYTES = 48
#: global_simple broadcasts the table's keys up to this size (Spark's autoBroadcastJoinThreshold default)
BROADCAST_KEYS_BYTES = 10 * 1024 * 1024
#: record index: batch keys per lookup task at least (a task looks up several buckets' keys below it)
LOOKUP_TASK_KEYS = 25_000
#: a plan for entering rows of at most this many ranges is routed by expressions, not joins
INLINE_PLAN_RANGES = 64
#: merge-on-read: batch rows per log-writing task (a task writes the logs of many file groups)
LOG_TASK_ROWS = 250_000


def _write(spark: SparkSession, table: Table, cfg: TableConfig, view: FileSystemView, num_buckets: int,
           batch: DataFrame, n: int, upserts: int, data_schema: Any, ts: str, phases: Phases, cores: int,
           *, planned_seq: int, shadow_index: str | None = None, batch_id: str,
           carried: list[str] | None = None, batch_partitions: int | None = None) -> Written:
    """Tag, route, merge and index one attempt on ``view``; returns the commit's write set and counts.
    ``carried``: a ``--partial-update`` batch's columns (None: all); ``batch_partitions``: the
    partitions ``batch`` is hash-partitioned into by its identity (:func:`_dedupe`; None: unknown)."""
    # Each persist below happens inside the settings its plan needs: a cached plan keeps the
    # shuffle partitions it was planned with, and every later stage over it runs that many tasks
    if cfg.index_type == INDEX_RECORD:
        # a lookup task per index bucket the batch touches, not coalesced (a task's work is the
        # bucket's index files, not the few keys the shuffle carries) -- up to one per
        # LOOKUP_TASK_KEYS keys: a task that starts a Python worker's UDF costs ~0.1-1 s by itself,
        # and a 200-row batch over 16 buckets paid 16 of them for 200 lookups
        lookup_tasks = min(len(view.index_files), 200, -(-n // LOOKUP_TASK_KEYS))
        tag_conf = {"spark.sql.shuffle.partitions": max(cores, lookup_tasks),
                    "spark.sql.adaptive.coalescePartitions.enabled": "false"}
    else:  # global_simple joins the batch with every key of the table (the bucket index: no shuffle)
        tag_conf = {"spark.sql.shuffle.partitions": shuffle_partitions(view.num_rows * KEY_BYTES, cores)}
    stats: dict[str, dict[str, int]] = {}
    with job_conf(spark, **tag_conf):
        tagged = _tag(spark, table, cfg, view, num_buckets, batch,
                      batch_partitions=batch_partitions).persist(StorageLevel.MEMORY_AND_DISK)
        if cfg.index_type != INDEX_BUCKET and not view.file_groups and not cfg.partition_fields:
            # an empty unpartitioned table: nothing to find, every upsert enters the one partition
            # (counted while the batch was deduplicated), so no query is needed
            # (and every delete is of an absent key)
            stats = {"": {"found": 0, "moved": 0, "entering": upserts, ABSENT_DELETES: n - upserts}}
        elif cfg.index_type != INDEX_BUCKET:  # the bucket index routes by hash: nothing to count
            stats = _tag_stats(tagged)  # the stats job runs the lookups
    found = sum(s["found"] for s in stats.values())
    phases.done("tag", "routed by hash (bucket index: nothing to look up)" if cfg.index_type == INDEX_BUCKET
                else f"{plural(found, 'key')} found in the table")
    shadow = None
    if shadow_index is not None:
        # the scan's join, sized as a global_simple table's tag phase sizes it
        with job_conf(spark, **{"spark.sql.shuffle.partitions": shuffle_partitions(view.num_rows * KEY_BYTES, cores)}):
            shadow = _shadow(spark, table, cfg, view, num_buckets, tagged, n, shadow_index)
        d = shadow["disagreements"]
        phases.done("shadow", f"{shadow_index}: {plural(shadow['keys_compared'], 'key')} compared, "
                    + ", ".join(f"{d[k]} {k}" for k in TEE_KINDS))
    actions, groups, decided = _route(spark, table, cfg, view, num_buckets, tagged, stats, batch_id=batch_id,
                                      carried=carried)
    names = data_schema.names
    actions = actions.select(*[F.col(c) for c in names], F.col(OP), F.col(tasks.FOUND), F.col(TPART), F.col(TFID))
    ctx = tasks.MergeContext(
        table_uri=table.uri,
        instant=ts,
        schema=data_schema,
        base_files={f"{p}\x00{f}": s.path for (p, f), s in view.file_groups.items()},
        precombine=cfg.precombine_field,
        emit_index=cfg.index_type == INDEX_RECORD,
        snapshot_seq=planned_seq,
        log_files={f"{p}\x00{f}": [lf.path for lf in s.logs] for (p, f), s in view.file_groups.items() if s.logs},
        carried=carried,
    )
    # copy-on-write rewrites each touched file group; merge-on-read appends a log to it
    task = tasks.append_log if cfg.merge_on_read else tasks.merge_file_group
    merged = actions.groupBy(TPART, TFID).applyInArrow(tasks.bind(task, ctx=ctx), tasks.MERGE_OUTPUT)
    # copy-on-write: as many merge tasks as file groups (up to 2000), at least one per core.
    # Not coalesced: the shuffle carries only the batch, while each task reads and rewrites a
    # whole file group, so adaptive execution would judge the partitions small and merge them
    # into one task. Merge-on-read (record, global_simple): a log costs what its rows cost, so
    # the tasks follow the batch -- one per new file group (those write a base) plus one per
    # LOG_TASK_ROWS rows -- and a uniform batch over a 10x larger table does not get 10x the tasks
    merge_tasks = groups
    if cfg.merge_on_read and cfg.index_type != INDEX_BUCKET:
        merge_tasks = (groups - len(view.file_groups)) + -(-n // LOG_TASK_ROWS)
    # the merges' rows decided without writing, counted while they run: most batches have none,
    # and knowing it spares the query that would look for them (below)
    merge_reads = Observation("bucketindex_merge_reads")
    merged = merged.observe(merge_reads, F.coalesce(F.sum((F.col("kind") == F.lit(action.READ)).cast("long")),
                                                    F.lit(0)).alias("reads"))
    with job_conf(spark, **{"spark.sql.shuffle.partitions": max(cores, min(merge_tasks, 2000)),
                            "spark.sql.adaptive.coalescePartitions.enabled": "false"}):
        merged = merged.persist(StorageLevel.MEMORY_AND_DISK)
        files = [r.asDict() for r in merged.filter("kind = 'file'").collect()]
    logs = sum(1 for f in files if f["path"] and f["log"])
    phases.done("write", plural(sum(1 for f in files if f['path'] and not f['log']), "data file")
                + (f", {plural(logs, 'log')}" if cfg.merge_on_read else ""))
    index_added: list[dict[str, Any]] = []
    if cfg.index_type == INDEX_RECORD:
        entries = merged.filter("kind = 'index'").select("key", "part", "fid", "tomb").withColumn(
            "bucket", bucket_expr(F.col("key"), num_buckets)
        )
        with job_conf(spark, **{"spark.sql.shuffle.partitions": max(cores, min(num_buckets, 200))}):
            written = entries.groupBy("bucket").applyInArrow(
                tasks.bind(tasks.write_index_delta, table_uri=table.uri, instant=ts, snapshot_seq=planned_seq), tasks.DELTA_OUTPUT
            ).collect()
        index_added = [r.asDict() for r in written]
        phases.done("index", plural(len(index_added), "index delta"))
    # rows decided without writing (the action's rule: action.read_set): the merges' and the routing's
    reads = merged.filter(F.col("kind") == F.lit(action.READ)).select("key", "part", "fid")
    if decided is not None:
        reads = reads.unionByName(decided)
    read_files: list[dict[str, Any]] = []
    read_groups: list[tuple[str | None, str | None]] = []
    # the routing's decided rows: absent deletes (counted with the tag stats) and, with a precombine
    # field and movers, stale moves (not counted: looked for)
    routed_reads = decided is not None and (
        sum(s.get(ABSENT_DELETES, 0) for s in stats.values()) > 0
        or (cfg.index_type != INDEX_BUCKET and bool(cfg.precombine_field) and rules.any_moved(stats)))
    # the common case: nothing decided without writing, and no query to find it out
    may_read = routed_reads or int(merge_reads.get.get("reads") or 0) > 0
    if not may_read or reads.isEmpty():
        pass
    elif action.needs_read_files(cfg.index_type):
        with job_conf(spark, **{"spark.sql.shuffle.partitions": max(cores, min(num_buckets, 200))}):
            read_files = [r.asDict() for r in reads.withColumn("bucket", bucket_expr(F.col("key"), num_buckets))
                          .select("key", "bucket").groupBy("bucket").applyInArrow(
                              tasks.bind(tasks.write_index_reads, table_uri=table.uri, instant=ts,
                                         snapshot_seq=planned_seq), tasks.DELTA_OUTPUT).collect()]
    else:  # the groups only (few): the bucket index's groups, global_simple's holders and absent deletes
        read_groups = [(r["part"], r["fid"]) for r in reads.select("part", "fid").distinct().collect()]
    merged.unpersist()
    tagged.unpersist()
    counts = {k: sum(int(f[k] or 0) for f in files) for k in ("inserted", "updated", "deleted")}
    counts["moved"] = sum(s["moved"] for s in stats.values())  # keys entering another partition (at most)
    return action.attempt_written(
        files=files, index_deltas=index_added, counts=counts, num_buckets=num_buckets, shadow=shadow,
        reads=action.read_set(index_type=cfg.index_type, groups=read_groups, read_files=read_files))
