"""Bootstrap: make a table of an existing Parquet dataset (RFC-08's one-time migration).

Two modes (format.md §5.3):

* ``reference`` -- the user's files stay where they are and become the table's first file
  slices, one file group per file; only the record index is written, from one scan of the
  key columns. The table is format version 3: its ``table.json`` names the dataset and the
  Hive path columns a referenced file does not hold, which readers add with the key column.
* ``rewrite`` -- every row is written into the table's own layout (an upsert of the whole
  dataset into the empty table, recorded as a ``bootstrap`` instant). The bucket index needs
  it: its file groups are hash buckets, which a user's files are not.

This module holds the bootstrap's rules once, for both engines: finding the dataset's files
and partition values, the checks that refuse a bootstrap before anything is written, which
file becomes which file group, the duplicate choice by precombine (format.md §8's order,
:mod:`spark_jobs.table.ordering`), the index entries, and the commit (:func:`run`). The
engines supply primitives (:class:`BootstrapEngine`: scan the dataset, rewrite a file
group, write the index buckets, upsert the rows): Spark's is :mod:`spark_jobs.jobs.bootstrap`,
the in-process one :mod:`spark_jobs.arrow_engine.bootstrap`. The per-file kernels here
(:func:`scan_keys`, :func:`check_bucket`, :func:`rewrite_files`, :func:`read_files`) are
pyspark-free: Spark runs them in its tasks, the Arrow engine in this process.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Protocol
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from spark_jobs.exceptions import BadInputError
from spark_jobs.io.filesystem import resolve
from spark_jobs.io.storage import redact_uri
from spark_jobs.table.action.options import (
    CSV,
    POSITIONAL,
    VerbOptions,
    check_choice,
    check_engine,
    check_heartbeat_timeout,
    option,
)
from spark_jobs.table.action.transaction import Transaction, repair_abandoned
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.config import (
    DEFAULT_NUM_BUCKETS,
    EVOLVING_FORMAT_VERSION,
    INDEX_BUCKET,
    INDEX_GLOBAL_SIMPLE,
    INDEX_RECORD,
    MIRRORS,
    REFERENCE_FORMAT_VERSION,
    TABLE_TYPES,
    TableConfig,
    check_field_names,
    new_auto_compact,
    new_table_type,
)
from spark_jobs.table.commit import EngineInfo, FileGroupChange, IndexFileChange, Written
from spark_jobs.table.faults import maybe_crash
from spark_jobs.table.layout import REFERENCE_PREFIX, data_file_name
from spark_jobs.table.ordering import ranks
from spark_jobs.table.reader import META_PREFIX, canonical_keys, read_data_file
from spark_jobs.table.schema import check_timestamp_units, stored_schema, stored_type
from spark_jobs.table.shadow import SAMPLES
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action
from spark_jobs.table.view import FileSystemView, encode_schema
from spark_jobs.text import plural

if TYPE_CHECKING:
    from spark_jobs.table.action.engine import EngineChoice

__all__ = ["MODES", "MODE_REFERENCE", "MODE_REWRITE", "SourceFile", "SourceDataset", "discover",
           "check_bootstrap", "default_mode", "default_batch_id", "reference_path", "file_id_of",
           "existing_bootstrap", "schema_problem", "BootstrapOptions", "BOOTSTRAP_INDEXES", "refuse_reference", "BootstrapEngine", "Prepared", "prepare",
           "run", "execute", "scan_keys", "check_bucket", "rewrite_files", "read_files", "check_schemas",
           "scan_schema", "CHECK_SCHEMA", "KEY", "rewrite_identity_field", "footprint"]

log = logging.getLogger("bucketindex.bootstrap")

#: the canonical record key column (``spark_jobs.table.reader``'s META_PREFIX + key)
KEY = "_bi_key"
#: the key scan's output: a row per source row (``problem`` set on one row per bad file)
SCAN_FIELDS = [(KEY, pa.string()), ("fno", pa.int32()), ("row", pa.int64()), ("problem", pa.string())]
#: :func:`check_bucket`'s output
CHECK_SCHEMA = pa.schema([("kind", pa.string()), ("fno", pa.int32()), ("n", pa.int64()), ("bad", pa.int64()),
                          ("problem", pa.string()), ("key", pa.string()), ("row", pa.int64())])

MODE_REFERENCE = "reference"
MODE_REWRITE = "rewrite"
MODES = (MODE_REFERENCE, MODE_REWRITE)
#: key types whose string form is the same in Arrow (which computes a referenced file's keys
#: at read time) and in Spark (which computes every later batch's): a key must read alike
#: on both sides or an upsert would not find the row it updates
REFERENCE_KEY_TYPES = (pa.string(), pa.large_string(), pa.int8(), pa.int16(), pa.int32(), pa.int64())


@dataclass(frozen=True)
class SourceFile:
    path: str  # on the dataset's filesystem
    size: int
    #: Hive path values of the file's directories (decoded), the table's partition among them
    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class SourceDataset:
    uri: str
    root: str  # the dataset's root on its filesystem
    schema: pa.Schema  # the rows' schema: the files' columns, then the Hive path columns
    path_columns: list[str]  # columns whose values come from directory names
    files: list[SourceFile]

    def partition_value(self, f: SourceFile, partition_field: str | None) -> Any:
        return f.values.get(partition_field) if partition_field else None


@dataclass(frozen=True, kw_only=True)
class BootstrapOptions(VerbOptions):
    """One bootstrap, as the CLI, the operator and the Python API give it, validated once when
    made (BadInputError: one line, exit 2, before any engine or JVM starts; the checks that need
    the dataset are :func:`check_bootstrap`'s). :meth:`to_argv` / :meth:`from_args` are the
    CLI's form (:mod:`.options`): the Airflow operator's spark-submit arguments come from here."""

    VERB = "bootstrap"

    table: str = option(form=POSITIONAL)
    source: str = option(form=POSITIONAL)
    record_key: list[str] = option("--record-key", form=CSV)
    partition_field: str | None = option("--partition-field", default=None)
    precombine_field: str | None = option("--precombine-field", default=None)
    index: str = option("--index", default=INDEX_RECORD)
    #: reference | rewrite; default reference for the record index, rewrite for the others
    mode: str | None = option("--mode", default=None)
    num_buckets: int | None = option("--num-buckets", default=None)
    table_type: str | None = option("--table-type", default=None)
    #: auto | spark | arrow (``spark_jobs.table.action.engine``); None means auto
    engine: str | None = option("--engine", default=None)
    batch_id: str | None = option("--batch-id", default=None)
    heartbeat_timeout_s: float | None = option("--heartbeat-timeout", default=None)
    target_file_rows: int | None = option("--target-file-rows", default=None)
    #: ``--mirror delta``: the table's Delta projection from its first commit (format.md §11)
    mirror: str | None = option("--mirror", default=None)
    #: the in-process engine's memory budget (``4g``); default derived from the machine
    memory_budget: str | None = option("--memory-budget", default=None)

    def __post_init__(self) -> None:
        # the checks that need no dataset and no table: a bad option costs a second, not a JVM's start
        if not self.record_key:
            raise BadInputError("--record-key must name at least one field")
        check_field_names(record_key=list(self.record_key), partition_field=self.partition_field,
                          precombine_field=self.precombine_field)
        check_choice("--index", self.index, BOOTSTRAP_INDEXES)
        check_choice("--mode", self.mode, MODES)
        check_choice("--table-type", self.table_type, TABLE_TYPES)
        check_choice("--mirror", self.mirror, MIRRORS)
        if self.num_buckets is not None and self.num_buckets < 1:
            raise BadInputError(f"--num-buckets must be at least 1, got {self.num_buckets}")
        check_heartbeat_timeout(self.heartbeat_timeout_s)
        check_engine(self.engine, self.memory_budget)
        if self.mode == MODE_REFERENCE:
            refuse_reference(self.index)


#: the index types a bootstrap writes
BOOTSTRAP_INDEXES = (INDEX_RECORD, INDEX_BUCKET, INDEX_GLOBAL_SIMPLE)


def refuse_reference(index: str) -> None:
    """BadInputError for ``--mode reference`` with an index whose file groups a user's files
    cannot be: the bucket index's are hash buckets; global_simple is not what reference writes."""
    if index == INDEX_BUCKET:
        raise BadInputError("the bucket index needs --mode rewrite: its file groups are hash buckets, "
                            "which the dataset's files are not")
    if index == INDEX_GLOBAL_SIMPLE:
        raise BadInputError("the global_simple index needs --mode rewrite: --mode reference writes a record index")


def default_mode(index: str) -> str:
    return MODE_REFERENCE if index == INDEX_RECORD else MODE_REWRITE


def default_batch_id(source: str) -> str:
    """A bootstrap of one dataset has one batch id, so running it again is a no-op."""
    return f"bootstrap-{hashlib.sha1(source.rstrip('/').encode()).hexdigest()[:16]}"


def discover(uri: str) -> SourceDataset:
    """The dataset's files and their Hive path values, as pyarrow reads the dataset
    (``partitioning="hive"``, files starting with ``.`` or ``_`` ignored)."""
    io, root = resolve(uri)
    if not io.exists(root):
        raise BadInputError(f"source {uri} does not exist")
    try:
        dataset = ds.dataset(root, filesystem=io.fs, format="parquet", partitioning="hive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as e:  # TypeError: files that disagree
        raise BadInputError(f"cannot read the Parquet dataset at {uri}: {str(e).splitlines()[0]}") from e
    frags = list(dataset.get_fragments())
    if not frags:
        raise BadInputError(f"source {uri} holds no Parquet files")
    # the path columns are the Hive fields some file's directories name: pyarrow 26 reports the
    # partitioning of a flat dataset (no name=value directory) with the whole dataset's schema,
    # which would make every column a path column that no path holds
    keys = [ds.get_partition_keys(frag.partition_expression) for frag in frags]
    named = {k for values in keys for k in values}
    part_schema = dataset.partitioning.schema if dataset.partitioning is not None else pa.schema([])
    path_columns = [n for n in part_schema.names if n in named]
    files = []
    sizes = {i.path: i.size for i in io.fs.get_file_info([f.path for f in frags])}
    for frag, values in zip(frags, keys):
        files.append(SourceFile(frag.path, int(sizes.get(frag.path) or 0),
                                {k: v for k, v in values.items() if k in path_columns}))
    files.sort(key=lambda f: f.path)
    return SourceDataset(uri, root, dataset.schema, path_columns, files)


def check_bootstrap(table: Table, source: SourceDataset, *, record_key: list[str], partition_field: str | None,
                    precombine_field: str | None, index: str, mode: str) -> None:
    """Everything that refuses a bootstrap before anything is written (BadInputError)."""
    check_field_names(record_key=list(record_key), partition_field=partition_field, precombine_field=precombine_field)
    if index not in BOOTSTRAP_INDEXES:
        raise BadInputError(f"--index must be record, bucket or global_simple, got {index!r}")
    if mode not in MODES:
        raise BadInputError(f"--mode must be reference or rewrite, got {mode!r}")
    if mode == MODE_REFERENCE:
        refuse_reference(index)
    names = source.schema.names
    for label, f in [("record key", k) for k in record_key] + [("partition", partition_field),
                                                              ("precombine", precombine_field)]:
        if f and f not in names:
            raise BadInputError(f"{label} field {f!r} is not in the source (columns: {', '.join(names)})")
    if any(n.startswith(META_PREFIX) for n in names):
        raise BadInputError("source columns may not start with '_bi_' (reserved for bucketindex)")
    if mode == MODE_REFERENCE:
        for k in record_key:
            t = source.schema.field(k).type
            if t not in REFERENCE_KEY_TYPES:
                raise BadInputError(f"--mode reference needs string or integer record key columns ({k} is {t}); "
                                    f"use --mode rewrite")
        if partition_field and partition_field not in source.path_columns:
            raise BadInputError(f"--mode reference needs the dataset partitioned by {partition_field} directories "
                                f"({partition_field}=<value>/, Hive style): a file group holds one partition; "
                                f"use --mode rewrite")
        _check_locations(table, source)


def _check_locations(table: Table, source: SourceDataset) -> None:
    """A referenced file is named relative to the table root, so both must be on one filesystem,
    and neither may hold the other (the dataset's listing would take in the table's files)."""
    if _filesystem(source.uri) != _filesystem(table.uri):
        raise BadInputError("--mode reference needs the dataset and the table on one filesystem; use --mode rewrite")
    src, root = source.root.rstrip("/"), table.layout.root.rstrip("/")
    if src == root or root.startswith(src + "/") or src.startswith(root + "/"):
        raise BadInputError(f"--mode reference needs the table outside the dataset and the dataset outside the "
                            f"table ({table.uri} and {source.uri})")


def _filesystem(uri: str) -> tuple[str, str]:
    """Which filesystem a URI is on: the scheme, and the host for HDFS (an S3 path starts with its bucket)."""
    p = urlparse(uri)
    if len(p.scheme) <= 1 or p.scheme == "file":  # a plain path (or a Windows drive letter)
        return ("file", "")
    return (p.scheme.replace("s3a", "s3"), p.netloc if p.scheme == "hdfs" else "")


def reference_path(table: Table, file_path: str) -> str:
    """A dataset file's path relative to the table root (it starts with ``../``)."""
    rel = posixpath.relpath(file_path, table.layout.root)
    assert rel.startswith(REFERENCE_PREFIX), (file_path, table.layout.root)
    return rel


def file_id_of(rel: str) -> str:
    """A referenced file's file group id: 32 hex digits, the same on every run."""
    return hashlib.md5(rel.encode()).hexdigest()


def existing_bootstrap(table: Table, batch_id: str) -> Any:
    """The completed bootstrap of ``batch_id`` (a rerun: nothing to do); BadInputError when
    the table holds anything else -- a bootstrap makes a new table."""
    if table.config is None:
        return None
    done = table.commit_for_batch(batch_id)
    if done is not None:
        return done
    tl = table.timeline.reload()
    if tl.completed(list(Action.WRITES)):
        raise BadInputError(f"{table.uri} already holds a table with data; bootstrap makes a new table "
                            f"(upsert the dataset into it instead)")
    return None


def schema_problem(expected: pa.Schema, actual: pa.Schema, path_columns: list[str]) -> str | None:
    """Why a dataset file cannot be one of a reference table's file slices, or None."""
    want = {(f.name, f.type) for f in expected if f.name not in path_columns}
    have = {(f.name, f.type) for f in actual if f.name not in path_columns}
    if want != have:
        return (f"columns {', '.join(f'{n} {t}' for n, t in sorted(have, key=str))} differ from the dataset's "
                f"{', '.join(f'{n} {t}' for n, t in sorted(want, key=str))}")
    return None



# -- the engines' primitives ------------------------------------------------------------
class BootstrapEngine(Protocol):
    """What an engine supplies; :func:`execute` holds every rule. One instance serves one run."""

    name: str

    def partition_dirs(self, source: SourceDataset, field: str | None) -> dict[Any, str]:
        """Each partition value of the dataset -> its directory as the table names it (the
        expression every write of this engine uses)."""

    def scan(self, source: SourceDataset, opts: BootstrapOptions, *, num_buckets: int) -> list[dict[str, Any]]:
        """Reference mode: :func:`scan_keys` over every file, then :func:`check_bucket` over the
        keys of each index bucket (every copy of a key in one call); returns the check rows.
        The engine keeps the scanned keys for :meth:`write_index`."""

    def rewrite_files(self, table: Table, todo: list[tuple[int, str, str, str, list[int]]], *, instant: str,
                      snapshot_seq: int, schema: pa.Schema) -> list[dict[str, Any]]:
        """:func:`rewrite_files` over ``(fno, rel, part, fid, drop)``; one row per file."""

    def write_index(self, table: Table, *, losers: dict[int, list[int]], locations: list[tuple[str, str]],
                    instant: str, snapshot_seq: int) -> list[dict[str, Any]]:
        """One index delta per bucket of the scanned keys but ``losers`` (fno -> rows), each key
        at its file's ``locations[fno]`` (partition, file id); one row per delta written."""

    def read_dataset(self, source: SourceDataset) -> Any:
        """Rewrite mode: the dataset's rows (:func:`read_files`) as the engine's frame."""

    def count_identities(self, frame: Any, *, record_key: list[str], identity_field: str | None
                         ) -> tuple[int, int, int, list[str]]:
        """Rows, identities seen more than once, the rows holding them, and up to SAMPLES of
        those keys (smallest first). An identity is the record key, with ``identity_field``'s
        value when given."""

    def upsert(self, opts: UpsertOptions) -> dict[str, Any]:
        """Rewrite mode: the upsert of ``opts.source_df`` (this engine's frame) into the new table."""

    def release(self) -> None:
        """Free what the run held (cached frames)."""


# -- the per-file kernels (both engines run these) ----------------------------------------
def scan_schema(source: SourceDataset, precombine: str | None) -> pa.Schema:
    return pa.schema(SCAN_FIELDS + ([("pre", stored_type(source.schema.field(precombine).type))]
                                    if precombine else []))


def _path_values_from(values: dict[str, Any], schema: pa.Schema, path_columns: list[str], n: int) -> dict[str, Any]:
    return {c: pa.array([values.get(c)] * n, schema.field(c).type) for c in path_columns}


def scan_keys(files: Iterable[pa.RecordBatch], *, source_uri: str, paths: list[str], values: list[dict[str, Any]],
              schema: pa.Schema, path_columns: list[str], record_key: list[str], precombine: str | None,
              batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Over batches of file ordinals (``fno``): each file's keys (canonical, as a reader computes
    them), row numbers and precombine values; a file whose columns differ from the
    dataset's yields one row naming the problem instead."""
    io, _ = resolve(source_uri)
    out_fields = SCAN_FIELDS + ([("pre", stored_type(schema.field(precombine).type))] if precombine else [])
    out_schema = pa.schema(out_fields)
    for b in files:
        for fno in b.column("fno").to_pylist():
            path = paths[fno]
            with io.open_input_file(path) as f:
                pf = pq.ParquetFile(f)
                problem = schema_problem(schema, pf.schema_arrow, path_columns)
                if problem is not None:
                    yield pa.RecordBatch.from_pylist([{"fno": fno, "problem": problem}], schema=out_schema)
                    continue
                stored = pf.schema_arrow.names
                need = [c for c in dict.fromkeys([*record_key, *([precombine] if precombine else [])]) if c in stored]
                data = pf.read(columns=need)
            n = data.num_rows
            cols = {**_path_values_from(values[fno], schema, path_columns, n),
                    **dict(zip(data.column_names, data.columns))}
            arrays = [canonical_keys([cols[k] for k in record_key]), pa.array([fno] * n, pa.int32()),
                      pa.array(range(n), pa.int64()), pa.nulls(n, pa.string())]
            if precombine:
                arrays.append(cols[precombine].cast(out_schema.field("pre").type))
            yield from pa.table(arrays, schema=out_schema).to_batches(max_chunksize=batch_rows)


def check_bucket(key: tuple, t: pa.Table, *, precombine: str | None) -> pa.Table:
    """The checks of the scanned keys of one or more index buckets (every copy of a key in
    ``t``): ``file`` rows (a file's rows, its null or empty keys, its schema problem), one
    ``dups`` row (keys seen more than once, the rows holding them), up to SAMPLES ``sample``
    keys, and with ``precombine`` the ``loser`` rows: of each duplicated key every row but the
    one with the highest value (format.md §8's order: nulls lowest, NaN highest; ties: the
    later file, then the later row)."""
    out: list[dict[str, Any]] = []
    for r in t.filter(pc.is_valid(t.column("problem"))).group_by("fno").aggregate(
            [("problem", "max")]).to_pylist():
        out.append({"kind": "file", "fno": r["fno"], "n": 0, "bad": 0, "problem": r["problem_max"]})
    ok = t.filter(pc.is_null(t.column("problem")))
    k = ok.column(KEY)
    bad = pc.fill_null(pc.or_(pc.is_null(k), pc.equal(k, "")), True)
    files = ok.append_column("_bad", pc.cast(bad, pa.int64())).group_by("fno").aggregate(
        [("row", "count"), ("_bad", "sum")])
    for r in files.to_pylist():
        out.append({"kind": "file", "fno": r["fno"], "n": r["row_count"], "bad": r["_bad_sum"]})
    good = ok.filter(pc.invert(bad))
    counts = good.group_by(KEY).aggregate([("row", "count")])
    dup = counts.filter(pc.greater(counts.column("row_count"), 1))
    if dup.num_rows:
        out.append({"kind": "dups", "n": dup.num_rows, "bad": int(pc.sum(dup.column("row_count")).as_py())})
        for key_ in sorted(dup.column(KEY).to_pylist())[:SAMPLES]:
            out.append({"kind": "sample", "key": key_})
        if precombine:
            rows = good.filter(pc.is_in(good.column(KEY), value_set=dup.column(KEY)))
            # by rank in format.md §8's order (an Arrow sort by value, descending, would put NaN
            # below every number and disagree with the upserts and the read-time merge)
            rows = rows.append_column("_rank", pa.array(ranks(rows.column("pre")), pa.int64()))
            order = pc.sort_indices(rows, sort_keys=[(KEY, "ascending"), ("_rank", "descending"),
                                                     ("fno", "descending"), ("row", "descending")])
            rows = rows.take(order)
            keys_ = rows.column(KEY).combine_chunks()
            first = pc.not_equal(keys_.slice(1), keys_.slice(0, len(keys_) - 1))
            winner = pa.concat_arrays([pa.array([True]), first])
            for r in rows.filter(pc.invert(winner)).select(["fno", "row"]).to_pylist():
                out.append({"kind": "loser", "fno": r["fno"], "row": r["row"]})
    return pa.Table.from_pylist(out, schema=CHECK_SCHEMA)


def rewrite_files(rows: Iterable[pa.RecordBatch], *, table_uri: str, instant: str, snapshot_seq: int,
                  schema: pa.Schema, token: Callable[[], str],
                  write: Callable[..., int]) -> Iterator[pa.RecordBatch]:
    """Over ``(fno, rel, part, fid, drop)``: each referenced file with a losing duplicate,
    rewritten into the table's layout without the rows in ``drop``. ``token`` names the
    attempt (a Spark task's), ``write`` writes one marked data file
    (``write(table, instant, rel, rows, snapshot_seq=...) -> size``): the engines' kernels."""
    t = Table.open(table_uri)
    tok = token()
    out = pa.schema([("fno", pa.int32()), ("path", pa.string()), ("num_rows", pa.int64()), ("size", pa.int64())])
    for b in rows:
        for fno, rel, part, fid, drop in zip(*[b.column(c).to_pylist() for c in ("fno", "rel", "part", "fid", "drop")]):
            data = read_data_file(t, rel, schema.names).cast(schema)
            keep = np.ones(data.num_rows, dtype=bool)
            keep[np.asarray(drop, dtype=np.int64)] = False
            data = data.filter(pa.array(keep))
            new_rel = f"{part}/{data_file_name(fid, tok, instant)}" if part else data_file_name(fid, tok, instant)
            size = write(t, instant, new_rel, data, snapshot_seq=snapshot_seq)
            yield pa.RecordBatch.from_pylist([{"fno": fno, "path": new_rel, "num_rows": data.num_rows, "size": size}],
                                             schema=out)


def read_files(files: Iterable[pa.RecordBatch], *, source_uri: str, paths: list[str], values: list[dict[str, Any]],
               schema: pa.Schema, path_columns: list[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Over batches of file ordinals: every row of each file, its Hive path columns added, in
    the stored types (timestamps in microseconds, zone-aware ones in UTC) -- pyarrow reads the
    dataset for both engines, as it decodes Hive directory values the way it wrote them
    (Spark's discovery decodes ``%C3%A3`` byte by byte)."""
    io, _ = resolve(source_uri)
    out = stored_schema(schema)
    for b in files:
        for fno in b.column("fno").to_pylist():
            with io.open_input_file(paths[fno]) as f:
                pf = pq.ParquetFile(f)
                for batch in pf.iter_batches(batch_size=batch_rows):
                    cols = {**_path_values_from(values[fno], schema, path_columns, batch.num_rows),
                            **dict(zip(batch.schema.names, batch.columns))}
                    yield pa.RecordBatch.from_arrays([cols[n] for n in schema.names], schema=schema).cast(out)


def check_schemas(source: SourceDataset) -> None:
    """Every file's columns are the dataset's (read from the footers, a few at a time)."""
    io, _ = resolve(source.uri)

    def problem(path: str) -> str | None:
        with io.open_input_file(path) as f:
            return schema_problem(source.schema, pq.ParquetFile(f).schema_arrow, source.path_columns)

    with ThreadPoolExecutor(8) as pool:
        for f, p in zip(source.files, pool.map(problem, [f.path for f in source.files])):
            if p is not None:
                raise BadInputError(f"dataset file {f.path}: {p}")


def rewrite_identity_field(opts: BootstrapOptions) -> str | None:
    """What a row's identity adds to its key in rewrite mode: its partition under the bucket
    index (a key lives once per partition there), nothing under the global ones -- the
    upsert's own dedupe rule, so the duplicate counts say what the upsert will keep."""
    return opts.partition_field if opts.index == INDEX_BUCKET and opts.partition_field else None


def footprint(source: SourceDataset, *, expansion: int) -> int:
    """Bytes the in-process engine would hold at its peak: the dataset decoded (rewrite mode
    holds every row; reference mode the key columns and the files it rewrites, bounded by the
    same) -- an upper bound, so a dataset ``auto`` runs in-process fits."""
    return sum(f.size for f in source.files) * expansion


# -- the run ---------------------------------------------------------------------------
@dataclass
class Prepared:
    """A bootstrap past the checks that need no engine (or its ``noop`` result)."""

    opts: BootstrapOptions
    source: SourceDataset
    table: Table
    mode: str
    batch_id: str
    noop: dict[str, Any] | None = None


def prepare(opts: BootstrapOptions) -> Prepared:
    """The dataset found and every check that refuses a bootstrap before anything is written
    and before any engine starts (BadInputError); a rerun of a completed bootstrap is a no-op."""
    mode = opts.mode or default_mode(opts.index)
    source = discover(opts.source)
    check_timestamp_units(source.schema, source=opts.source)
    table = Table.open(opts.table)
    check_bootstrap(table, source, record_key=opts.record_key, partition_field=opts.partition_field,
                    precombine_field=opts.precombine_field, index=opts.index, mode=mode)
    batch_id = opts.batch_id or default_batch_id(opts.source)
    prepared = Prepared(opts, source, table, mode, batch_id)
    done = existing_bootstrap(table, batch_id)
    if done is not None:
        log.info("%s was bootstrapped from %s already (instant %s): nothing to do", redact_uri(opts.table),
                 redact_uri(opts.source), done.timestamp)
        meta = table.timeline.read_metadata(done)
        prepared.noop = {"instant": done.timestamp, "batch_id": batch_id, "noop": True, "mode": mode,
                         "index_type": meta.get("index_type"),
                         "counts": (meta.get("bootstrap") or {}).get("counts", {}), "timings_ms": {}}
    return prepared


def run(engine_for: Callable[[Prepared], tuple[BootstrapEngine, int | None]], opts: BootstrapOptions, *,
        choice: "EngineChoice | None" = None, prepared: Prepared | None = None) -> dict[str, Any]:
    """Bootstrap ``opts.table`` from ``opts.source``; returns the instant, counts and timings.

    ``engine_for`` makes the engine once the checks passed (a bad option or a rerun of a
    completed bootstrap starts none) and says how long its session took to start (reported
    beside the total, not inside it, as an upsert's is). Raises BadInputError (nothing written)
    for a bad dataset or options, duplicate keys without a precombine field, or a table that
    already holds data. ``prepared``: :func:`prepare`'s result, when the caller sized the
    dataset with it already.
    """
    started = time.perf_counter()
    prepared = prepared or prepare(opts)
    if prepared.noop is not None:
        return prepared.noop
    t = time.perf_counter()
    engine, session_ms = engine_for(prepared)
    session_here = int((time.perf_counter() - t) * 1000) if session_ms is not None else 0
    result = execute(engine, prepared, session_ms=session_ms, choice=choice)
    result["timings_ms"]["total_ms"] = int((time.perf_counter() - started) * 1000) - session_here
    if session_ms is not None:
        result["session_start_ms"] = session_ms
    if choice is not None:
        result["engine"] = choice.as_metadata()
    return result


def execute(engine: BootstrapEngine, prepared: Prepared, *, session_ms: int | None = None,
            choice: "EngineChoice | None" = None) -> dict[str, Any]:
    """Run one mode of a prepared bootstrap on ``engine``."""
    opts, source = prepared.opts, prepared.source
    log.info("bootstrapping %s from %s (%s mode, %s, %s index, %s engine)", redact_uri(opts.table),
             redact_uri(opts.source), prepared.mode, plural(len(source.files), "file"), opts.index, engine.name)
    try:
        if prepared.mode == MODE_REFERENCE:
            return _reference(engine, prepared, session_ms=session_ms, choice=choice)
        return _rewrite(engine, prepared, choice=choice)
    finally:
        engine.release()


def _refuse_duplicates(n_keys: int, n_rows: int, samples: list[str], key: list[str]) -> None:
    raise BadInputError(
        f"{n_keys} record key(s) ({','.join(key)}) appear more than once in the source ({n_rows} rows), "
        f"e.g. {', '.join(map(repr, samples))}; pass --precombine-field to keep the row with its highest value")


@dataclass
class _Checked:
    """The key scan's verdict: rows per file, duplicated keys, the rows that lose."""

    per_file: dict[int, int]
    n_dup: int
    drops: dict[int, list[int]]


def _tally(found: Iterable[dict[str, Any]], source: SourceDataset, opts: BootstrapOptions) -> _Checked:
    per_file: dict[int, int] = {}
    bad_keys = n_dup = dup_rows = 0
    samples: list[str] = []
    drops: dict[int, list[int]] = {}
    for r in found:
        kind = r["kind"]
        if kind == "file":
            if r["problem"] is not None:
                raise BadInputError(f"dataset file {source.files[int(r['fno'])].path}: {r['problem']}")
            per_file[int(r["fno"])] = per_file.get(int(r["fno"]), 0) + int(r["n"])
            bad_keys += int(r["bad"])
        elif kind == "dups":
            n_dup += int(r["n"])
            dup_rows += int(r["bad"])
        elif kind == "sample":
            samples.append(r["key"])
        elif kind == "loser":
            drops.setdefault(int(r["fno"]), []).append(int(r["row"]))
    if bad_keys:
        raise BadInputError(f"{bad_keys} row(s) have a null or empty record key ({','.join(opts.record_key)})")
    if not sum(per_file.values()):
        raise BadInputError(f"the dataset at {opts.source} has no rows")
    if n_dup and not opts.precombine_field:
        _refuse_duplicates(n_dup, dup_rows, sorted(samples)[:SAMPLES], opts.record_key)
    for rows in drops.values():
        rows.sort()
    return _Checked(per_file, n_dup, drops)


def _reference_config(opts: BootstrapOptions, source: SourceDataset, num_buckets: int) -> TableConfig:
    mirrors_asked = [opts.mirror] if opts.mirror else []
    table_type = new_table_type(table_type=opts.table_type, mirrors=mirrors_asked)  # an upsert's default
    return TableConfig(
        record_key_fields=list(opts.record_key), index_type=INDEX_RECORD,
        num_buckets=num_buckets,
        partition_fields=[opts.partition_field] if opts.partition_field else [],
        precombine_field=opts.precombine_field,
        table_type=table_type,
        auto_compact=new_auto_compact(table_type=table_type, auto_compact=None),
        **({"target_file_rows": opts.target_file_rows} if opts.target_file_rows else {}),
        format_version=REFERENCE_FORMAT_VERSION,
        mirrors=mirrors_asked,
        reference={"source": redact_uri(opts.source),
                   "path_columns": {c: str(source.schema.field(c).type) for c in source.path_columns}},
    )


def _reference(engine: BootstrapEngine, prepared: Prepared, *, session_ms: int | None,
               choice: "EngineChoice | None") -> dict[str, Any]:
    opts, source, table, batch_id = prepared.opts, prepared.source, prepared.table, prepared.batch_id
    timings: dict[str, int] = {}
    t0 = time.perf_counter()
    parts = engine.partition_dirs(source, opts.partition_field)
    # the table's paths of the dataset's files need the table root, not the table: computed
    # before anything is written. One file group per file, its id from its path.
    rels = [reference_path(table, f.path) for f in source.files]
    fids = [file_id_of(r) for r in rels]
    fparts = [parts[source.partition_value(f, opts.partition_field)] for f in source.files]
    num_buckets = table.config.num_buckets if table.config is not None else (
        opts.num_buckets or DEFAULT_NUM_BUCKETS[INDEX_RECORD])
    checked = _tally(engine.scan(source, opts, num_buckets=num_buckets), source, opts)
    n_rows = sum(checked.per_file.values())
    timings["scan_ms"] = int((time.perf_counter() - t0) * 1000)
    log.info("phase scan     %6d ms %s, %s, %s", timings["scan_ms"], plural(n_rows, "row"),
             plural(len(source.files), "file"), plural(checked.n_dup, "duplicated key"))

    cfg = _reference_config(opts, source, num_buckets)
    existing = table.create(cfg)  # a rerun after a crash finds it: the options must agree
    if existing.reference != cfg.reference or existing.mirrors != cfg.mirrors or existing.format_version not in (
            cfg.format_version, EVOLVING_FORMAT_VERSION):
        raise BadInputError(f"{opts.table} was created by a bootstrap of {(existing.reference or {}).get('source')} "
                            f"with other options; remove it (it holds no data) or bootstrap that dataset")
    table = Table.load(opts.table)
    repair_abandoned(table, timeout_s=opts.heartbeat_timeout_s)  # abandoned instants only (a crashed bootstrap)
    # timestamps are stored in microseconds, zone-aware ones in UTC (format.md §5), as an upsert
    # or a rewrite stores them; the files keep their own types, and every reader casts to this schema
    data_schema = stored_schema(source.schema).append(pa.field(KEY, pa.string()))

    def attempt(view: FileSystemView, ts: str, retries: list[dict[str, Any]]) -> Written:
        t1 = time.perf_counter()
        rewritten: dict[int, dict[str, Any]] = {}
        if checked.drops:
            todo = [(fno, rels[fno], fparts[fno], fids[fno], rows) for fno, rows in sorted(checked.drops.items())]
            rewritten = {int(r["fno"]): r for r in engine.rewrite_files(table, todo, instant=ts, snapshot_seq=view.seq,
                                                                         schema=data_schema)}
        timings["rewrite_ms"] = int((time.perf_counter() - t1) * 1000)
        log.info("phase rewrite  %6d ms %d files with losing duplicates rewritten", timings["rewrite_ms"],
                 len(rewritten))
        t2 = time.perf_counter()
        written = engine.write_index(table, losers=checked.drops, locations=list(zip(fparts, fids)), instant=ts,
                                     snapshot_seq=view.seq)
        index_added = list(written)
        timings["index_ms"] = int((time.perf_counter() - t2) * 1000)
        log.info("phase index    %6d ms %d index deltas", timings["index_ms"], len(index_added))
        written = reference_written(
            source=source, source_label=redact_uri(opts.source), rels=rels, fids=fids, fparts=fparts,
            rows_per_file=checked.per_file, dropped=checked.drops, rewritten=rewritten, index_written=index_added,
            n_rows=n_rows, n_dup=checked.n_dup, num_buckets=num_buckets, schema=data_schema,
            session_start_ms=session_ms)
        return written.replace(engine=EngineInfo.from_json(choice.as_metadata())) if choice is not None else written

    plan = {"batch_id": batch_id, "operation": "bootstrap", "mode": MODE_REFERENCE, "source": redact_uri(opts.source),
            "index_type": INDEX_RECORD, "num_buckets": num_buckets}
    result = _commit_reference(table, plan, attempt, batch_id=batch_id, timings=timings, t0=t0)
    if not result["noop"]:
        c = result["counts"]
        log.info("committed %s: %s (%d referenced in place, %d rewritten)", result["instant"],
                 plural(c["rows"], "row"), c["files_referenced"], c["files_rewritten"])
    return result


def _commit_reference(table: Table, plan: dict[str, Any],
                      attempt: Callable[[FileSystemView, str, list[dict[str, Any]]], Written], *,
                      batch_id: str, timings: dict[str, int], t0: float) -> dict[str, Any]:
    """The reference bootstrap's commit: one ``bootstrap`` instant through the Transaction,
    one attempt (a bootstrap makes a new table, so a write completed meanwhile leaves nothing
    to redo on the new snapshot: a rerun finds its batch committed, or the table holding data;
    ConflictError, exit 3, names the conflict). A crash leaves a pending instant that readers
    ignore and the next run rolls back."""
    view = table.view()
    assert table.num_buckets(view) == plan["num_buckets"], (table.num_buckets(view), plan["num_buckets"])
    txn = Transaction(table, Action.BOOTSTRAP, plan, view=view).begin()
    log.info("instant %s: bootstrapping into %s", txn.ts, redact_uri(table.uri))

    def one(v: FileSystemView, retries: list[dict[str, Any]]) -> Written:
        written = attempt(v, txn.ts, retries)
        maybe_crash("before_complete")
        return written.replace(timings_ms={**timings, "total_ms": int((time.perf_counter() - t0) * 1000)})

    done = txn.run(one, max_retries=0, batch_id=batch_id, what="the bootstrap",
                   give_up="the bootstrap was not committed; nothing was written, run it again with the same batch id")
    if done.instant is None:  # a concurrent writer committed this batch
        meta = table.timeline.read_metadata(table.timeline.reload().find(done.applied_by))
        return {"instant": done.applied_by, "batch_id": batch_id, "noop": True, "mode": MODE_REFERENCE,
                "index_type": meta.get("index_type"), "counts": (meta.get("bootstrap") or {}).get("counts", {}),
                "timings_ms": dict(timings)}
    return {"instant": txn.ts, "batch_id": batch_id, "noop": False, "mode": MODE_REFERENCE,
            "index_type": INDEX_RECORD, "counts": done.metadata["bootstrap"]["counts"], "timings_ms": dict(timings)}


def reference_written(*, source: SourceDataset, source_label: str, rels: list[str], fids: list[str],
                      fparts: list[str], rows_per_file: dict[int, int], dropped: dict[int, list[int]],
                      rewritten: dict[int, dict[str, Any]], index_written: list[dict[str, Any]], n_rows: int,
                      n_dup: int, num_buckets: int, schema: pa.Schema,
                      session_start_ms: int | None = None) -> Written:
    """What a reference bootstrap attempt wrote (format.md §5.3), from what its engine reports:
    one file group per dataset file left with live rows -- the file itself (``reference``), or
    its rewrite without the losing duplicates (``rewritten[fno]``: ``path, num_rows, size``;
    ``replaces`` the file) -- and the record index's deltas (``index_written``: ``bucket, path,
    entries, size``). ``rows_per_file``: rows each file holds; ``dropped``: each file's losing
    rows; ``source_label``: the dataset's URI as it may be shown (redacted)."""
    groups: list[FileGroupChange] = []
    for fno, f in enumerate(source.files):
        live_rows = rows_per_file.get(fno, 0) - len(dropped.get(fno, []))
        if fno in rewritten:
            r = rewritten[fno]
            if r["num_rows"]:
                groups.append(FileGroupChange(partition=fparts[fno], file_id=fids[fno], path=r["path"],
                                              num_rows=r["num_rows"], size=r["size"], replaces=rels[fno]))
        elif live_rows > 0:
            groups.append(FileGroupChange(partition=fparts[fno], file_id=fids[fno], path=rels[fno],
                                          num_rows=live_rows, size=f.size, reference=True))
    live_total = sum(int(g.num_rows or 0) for g in groups)
    summary = {"source": source_label, "mode": MODE_REFERENCE,
               "counts": {"rows": live_total, "source_rows": n_rows,
                          "files_referenced": sum(1 for g in groups if g.reference),
                          "files_rewritten": len(rewritten), "duplicate_keys": n_dup,
                          "rows_dropped": n_rows - live_total}}
    return Written(
        operation="bootstrap", index_type=INDEX_RECORD, schema=encode_schema(schema), num_buckets=num_buckets,
        file_groups=tuple(groups),
        index_added=tuple(IndexFileChange(bucket=r["bucket"], path=r["path"], entries=r["entries"], size=r["size"],
                                          kind="delta") for r in index_written),
        index_removed=(),
        counts={"inserted": live_total, "updated": 0, "deleted": 0, "moved": 0, "rows_in_batch": n_rows,
                "keys_in_batch": live_total},
        bootstrap=summary, session_start_ms=session_start_ms)


def _rewrite(engine: BootstrapEngine, prepared: Prepared, *, choice: "EngineChoice | None") -> dict[str, Any]:
    opts, source, batch_id = prepared.opts, prepared.source, prepared.batch_id
    t0 = time.perf_counter()
    check_schemas(source)
    frame = engine.read_dataset(source)  # read once: the duplicate check and the upsert's passes reuse it
    total, n_dup, dup_rows, samples = engine.count_identities(frame, record_key=list(opts.record_key),
                                                              identity_field=rewrite_identity_field(opts))
    if not total:
        raise BadInputError(f"the dataset at {opts.source} has no rows")
    if n_dup and not opts.precombine_field:
        _refuse_duplicates(n_dup, dup_rows, samples, opts.record_key)
    scan_ms = int((time.perf_counter() - t0) * 1000)
    log.info("phase scan     %6d ms %d duplicated keys", scan_ms, n_dup)
    dropped = dup_rows - n_dup  # of each duplicated key, every row but the winner
    out_counts = {"rows": total - dropped, "source_rows": total, "files_referenced": 0,
                  "files_rewritten": len(source.files), "duplicate_keys": n_dup, "rows_dropped": dropped}
    upsert = UpsertOptions(
        table=opts.table, source=opts.source, record_key=list(opts.record_key),
        precombine_field=opts.precombine_field, partition_field=opts.partition_field, index=opts.index,
        num_buckets=opts.num_buckets, table_type=opts.table_type, batch_id=batch_id,
        target_file_rows=opts.target_file_rows, heartbeat_timeout_s=opts.heartbeat_timeout_s, mirror=opts.mirror,
        source_df=frame, action=Action.BOOTSTRAP, operation="bootstrap",
        extra_metadata={"bootstrap": {"source": redact_uri(opts.source), "mode": MODE_REWRITE, "counts": out_counts}},
    )
    result = engine.upsert(upsert)
    return {"instant": result["instant"], "batch_id": batch_id, "noop": result["noop"], "mode": MODE_REWRITE,
            "index_type": opts.index, "counts": out_counts,
            "timings_ms": {"scan_ms": scan_ms, **result.get("timings_ms", {})}}
