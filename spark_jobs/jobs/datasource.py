"""``spark.read.format("bucketindex")``: a snapshot through Spark 4's Python Data Source API.

    from spark_jobs.jobs.datasource import register
    register(spark)                      # once per session (``get_spark()`` does it unless told not to)
    spark.read.format("bucketindex").option("as_of", "2026-11-25T09:24:00").load(uri)
    spark.sql(f"CREATE TEMPORARY VIEW orders USING bucketindex OPTIONS (path '{uri}')")

Why a Python data source and not :func:`spark_jobs.jobs.read.read_table` behind a name: SQL
users reach a table by a format name and options (``USING bucketindex``), which only a
registered data source gives; and a Python source reads inside its tasks with pyarrow, so a
table on object storage is readable without hadoop-aws (which Spark's own Parquet reader
needs, and which this environment cannot fetch).

What the API (Spark 4.2) lets a source do, and what this one does with it:

* **partitions**: one ``InputPartition`` per group of consecutive file slices of the snapshot,
  at most :data:`PARTITION_BYTES` of files each (a slice costing its bytes plus
  :data:`SLICE_OPEN_COST`, as Spark's file sources weigh a file) and about a
  :data:`MIN_PARTITIONS`-th of a small snapshot, so every core gets work. Each task reads and merges its slices
  with :func:`spark_jobs.table.reader.read_slice` (the Arrow reader's one merge), in the
  snapshot's schema, and returns Arrow batches.
* **filters** (``DataSourceReader.pushFilters``, Spark 4.1+; used only when
  ``spark.sql.python.filterPushdown.enabled`` is true, which :func:`register` turns on):
  filters on the partition field (``=``, ``<=>``, ``IN``, ``IS NULL``, ``IS NOT NULL``) drop
  the slices whose partition directory proves they hold no matching row
  (:func:`spark_jobs.table.dataset.partition_candidates`) before any task is planned. Every
  filter is still handed back to Spark, which applies it to the rows: pruning only ever
  removes slices that cannot match, and Spark's own semantics decide each row.
* **columns**: the API has no column pruning (a reader gets the whole schema): every column of
  a slice is read, and Spark drops those the query does not use after the read.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
)
from pyspark.sql.types import StructType

from spark_jobs.exceptions import BadInputError

__all__ = ["NAME", "register", "BucketIndexDataSource", "BucketIndexScanSource", "SliceGroup",
           "PUSHDOWN_CONF", "PARTITION_BYTES", "MIN_PARTITIONS", "SLICE_OPEN_COST", "STORAGE_PREFIX"]

NAME = "bucketindex"
#: the session setting without which Spark refuses a reader that implements ``pushFilters``
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
#: bytes of file slices per input partition (Spark's ``spark.sql.files.maxPartitionBytes``)
PARTITION_BYTES = 128 * 1024 * 1024
#: what one slice costs besides its bytes (Spark's ``spark.sql.files.openCostInBytes``)
SLICE_OPEN_COST = 4 * 1024 * 1024
#: tasks a small snapshot is spread over (Spark divides by the session's cores, which a
#: planning worker does not know)
MIN_PARTITIONS = 8
#: options ``storage.<key>`` are storage options (``endpoint_url``, ``region``, credentials):
#: a task on another machine does not share the driver's environment
STORAGE_PREFIX = "storage."
#: rows per Arrow batch a task returns
BATCH_ROWS = 65_536
_OPTIONS = ("path", "as_of")
#: which source this session has registered (a session-scoped marker of ours)
_REGISTERED_CONF = "spark.bucketindex.datasource.registered"


def register(spark: SparkSession, *, filter_pushdown: bool = True) -> None:
    """Make ``format("bucketindex")`` and ``USING bucketindex`` known to ``spark``.

    With ``filter_pushdown`` (default) the session's :data:`PUSHDOWN_CONF` is turned on, so
    filters on the partition field prune slices; it only affects Python data sources that
    implement ``pushFilters``. Without it, the source registered implements none, and the
    session's setting is left as it is (Spark refuses a ``pushFilters`` reader when it is off).
    """
    kind = "pushdown" if filter_pushdown else "scan"
    if spark.conf.get(_REGISTERED_CONF, None) == kind:  # registering again only logs a WARN per job
        return
    if filter_pushdown:
        spark.conf.set(PUSHDOWN_CONF, "true")
        spark.dataSource.register(BucketIndexDataSource)
    else:
        spark.dataSource.register(BucketIndexScanSource)
    spark.conf.set(_REGISTERED_CONF, kind)


class SliceGroup(InputPartition):
    """The file slices one task reads: ``(base, logs)`` relative paths, with the snapshot's
    schema and precombine field (a task opens the table, not its timeline)."""

    def __init__(self, slices: list[tuple[str, list[str]]], *, schema: pa.Schema, precombine: str | None) -> None:
        super().__init__(None)
        self.slices = slices
        self.schema = schema
        self.precombine = precombine

    def __repr__(self) -> str:
        return f"SliceGroup({len(self.slices)} slices, first {self.slices[0][0] if self.slices else None})"


def _parse_options(options: Any) -> tuple[str, str | None, dict[str, str]]:
    """``(uri, as_of, storage options)``; an unknown option is bad input: a misspelt ``as_of``
    must not read the latest snapshot silently."""
    keys = {str(k).lower(): str(k) for k in options}
    storage = {k[len(STORAGE_PREFIX):]: str(options[orig]) for k, orig in keys.items() if k.startswith(STORAGE_PREFIX)}
    unknown = sorted(orig for k, orig in keys.items() if k not in _OPTIONS and not k.startswith(STORAGE_PREFIX))
    if unknown:
        raise BadInputError(f"unknown option(s) {', '.join(unknown)} for format {NAME!r}: it takes path, as_of "
                            f"and {STORAGE_PREFIX}<storage option>")
    uri = options.get("path")
    if not uri:
        raise BadInputError(f"format {NAME!r} needs the table: .load(uri) or OPTIONS (path '...')")
    as_of = options.get("as_of") or None
    return str(uri), as_of, storage


class BucketIndexScanSource(DataSource):
    """The ``bucketindex`` data source without filter pushdown (``register(filter_pushdown=False)``)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        """The snapshot's published schema (no ``_bi_*`` column). Resolved when the query is
        analysed; the rows come from the snapshot read when it is planned (a temporary view
        reads the latest snapshot at each query, in the schema it was created with)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        from spark_jobs.table.dataset import open_table, public_schema

        uri, as_of, storage = _parse_options(self.options)
        view = open_table(uri, storage_options=storage).view(as_of)
        return from_arrow_schema(public_schema(view.schema))

    def reader(self, schema: StructType) -> DataSourceReader:
        return SnapshotReader(self.options, schema)


class BucketIndexDataSource(BucketIndexScanSource):
    """The ``bucketindex`` data source, pruning slices by filters on the partition field."""

    def reader(self, schema: StructType) -> DataSourceReader:
        return PrunedSnapshotReader(self.options, schema)


class SnapshotReader(DataSourceReader):
    """Reads the snapshot: planning lists its slices (:meth:`partitions`), tasks read them."""

    def __init__(self, options: Any, schema: StructType) -> None:
        self.uri, self.as_of, self.storage = _parse_options(options)
        self.schema = schema
        #: partition-field filters (pushed ones): slices that cannot match are not read
        self.partition_filters: list[Filter] = []

    def partitions(self) -> Sequence[InputPartition]:
        from spark_jobs.table.dataset import open_table, partition_candidates

        table = open_table(self.uri, storage_options=self.storage)
        view = table.view(self.as_of)
        assert table.config is not None
        if view.schema is None:
            return []
        slices = [s for s in view.slices()
                  if _may_match(partition_candidates(table, s, view.schema), self.partition_filters)]
        # as Spark sizes file splits: at most PARTITION_BYTES, and a small table still spread
        # over about MIN_PARTITIONS tasks (one task would leave every other core idle)
        total = sum(s.total_size + SLICE_OPEN_COST for s in slices)
        target = min(PARTITION_BYTES, max(SLICE_OPEN_COST, total // MIN_PARTITIONS))
        groups: list[list[Any]] = []
        weight = target
        for s in slices:
            cost = s.total_size + SLICE_OPEN_COST
            if weight + cost > target:
                groups.append([])
                weight = 0
            groups[-1].append((s.path, [lf.path for lf in s.logs]))
            weight += cost
        return [SliceGroup(g, schema=view.schema, precombine=table.config.precombine_field) for g in groups]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.pandas.types import to_arrow_schema

        from spark_jobs.table.dataset import open_table
        from spark_jobs.table.reader import read_slice
        from spark_jobs.table.schema import conform

        if not isinstance(partition, SliceGroup) or not partition.slices:
            return  # an empty snapshot (Spark plans one partition anyway)
        target = to_arrow_schema(self.schema, timezone="UTC")  # exactly what Spark checks the batches against
        table = open_table(self.uri, storage_options=self.storage)
        for base, logs in partition.slices:
            rows = read_slice(table, base, logs, precombine=partition.precombine, schema=partition.schema)
            rows = conform(rows, target, target.names).replace_schema_metadata(None).cast(target)
            yield from rows.to_batches(max_chunksize=BATCH_ROWS)


class PrunedSnapshotReader(SnapshotReader):
    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Keep the partition field's filters for pruning slices, and hand every filter back:
        Spark evaluates each on the rows it reads (the pruning is by directory name alone)."""
        from spark_jobs.table.dataset import open_table

        table = open_table(self.uri, storage_options=self.storage)
        assert table.config is not None
        fields = list(table.config.partition_fields or [])
        for f in filters:
            if fields and f.attribute == (fields[0],) and isinstance(f, _PRUNING):
                self.partition_filters.append(f)
            yield f


_PRUNING = (EqualTo, EqualNullSafe, In, IsNull, IsNotNull)


def _may_match(candidates: list[Any] | None, filters: list[Filter]) -> bool:
    """Whether a slice whose partition value is one of ``candidates`` (None: unknown) may hold a
    row every filter accepts. A value of another Python type than the candidate's is not
    compared (Spark would coerce it): the slice is kept."""
    if candidates is None:
        return True
    for f in filters:
        if not any(_accepts(f, c) for c in candidates):
            return False
    return True


def _accepts(f: Filter, c: Any) -> bool:
    if isinstance(f, IsNull):
        return c is None
    if isinstance(f, IsNotNull):
        return c is not None
    values = list(f.value) if isinstance(f, In) else [f.value]  # type: ignore[attr-defined]
    for v in values:
        if v is None or c is None:
            if isinstance(f, EqualNullSafe) and v is None and c is None:
                return True
            continue
        if type(v) is not type(c) or v == c:
            return True
    return False
