"""Bootstrap: make a table of an existing Parquet dataset (RFC-08's one-time migration).

Two modes (format.md §5.3):

* ``reference`` -- the user's files stay where they are and become the table's first file
  slices, one file group per file; only the record index is written, from one scan of the
  key columns. The table is format version 3: its ``table.json`` names the dataset and the
  Hive path columns a referenced file does not hold, which readers add with the key column.
* ``rewrite`` -- every row is written into the table's own layout (an upsert of the whole
  dataset into the empty table, recorded as a ``bootstrap`` instant). The bucket index needs
  it: its file groups are hash buckets, which a user's files are not.

This module is the part that needs no Spark: finding the dataset's files and partition
values, the checks that refuse a bootstrap before anything is written, and the plan. The
Spark job is :mod:`spark_jobs.jobs.bootstrap`.
"""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.dataset as ds

from spark_jobs.exceptions import BadInputError
from spark_jobs.io.filesystem import resolve
from spark_jobs.table.action.transaction import Committed, Transaction
from spark_jobs.table.commit import FileGroupChange, IndexFileChange, Written
from spark_jobs.table.config import INDEX_BUCKET, INDEX_RECORD, check_field_names
from spark_jobs.table.layout import REFERENCE_PREFIX
from spark_jobs.table.reader import META_PREFIX
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action
from spark_jobs.table.view import FileSystemView, encode_schema

__all__ = ["MODES", "MODE_REFERENCE", "MODE_REWRITE", "SourceFile", "SourceDataset", "discover",
           "check_bootstrap", "default_mode", "default_batch_id", "reference_path", "file_id_of",
           "existing_bootstrap", "schema_problem", "commit_bootstrap", "reference_written"]

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
    except (pa.ArrowInvalid, OSError) as e:
        raise BadInputError(f"cannot read the Parquet dataset at {uri}: {str(e).splitlines()[0]}") from e
    frags = list(dataset.get_fragments())
    if not frags:
        raise BadInputError(f"source {uri} holds no Parquet files")
    part_schema = dataset.partitioning.schema if dataset.partitioning is not None else pa.schema([])
    path_columns = [n for n in part_schema.names]
    files = []
    sizes = {i.path: i.size for i in io.fs.get_file_info([f.path for f in frags])}
    for frag in frags:
        values = ds.get_partition_keys(frag.partition_expression)
        files.append(SourceFile(frag.path, int(sizes.get(frag.path) or 0),
                                {k: v for k, v in values.items() if k in path_columns}))
    files.sort(key=lambda f: f.path)
    return SourceDataset(uri, root, dataset.schema, path_columns, files)


def check_bootstrap(table: Table, source: SourceDataset, *, record_key: list[str], partition_field: str | None,
                    precombine_field: str | None, index: str, mode: str) -> None:
    """Everything that refuses a bootstrap before anything is written (BadInputError)."""
    check_field_names(record_key=list(record_key), partition_field=partition_field, precombine_field=precombine_field)
    if index not in (INDEX_RECORD, INDEX_BUCKET):
        raise BadInputError(f"--index must be record or bucket, got {index!r}")
    if mode not in MODES:
        raise BadInputError(f"--mode must be reference or rewrite, got {mode!r}")
    if mode == MODE_REFERENCE and index == INDEX_BUCKET:
        raise BadInputError("the bucket index needs --mode rewrite: its file groups are hash buckets, "
                            "which the dataset's files are not")
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



def commit_bootstrap(table: Table, plan: dict[str, Any], view: FileSystemView,
                     attempt: Callable[[Transaction, FileSystemView], Written], *, batch_id: str,
                     heartbeat_timeout_s: float | None = None) -> Committed:
    """The commit of every engine's bootstrap (either mode): roll back abandoned instants (a
    crashed bootstrap), reserve the ``bootstrap`` instant with ``plan`` on ``view``, and commit
    what ``attempt(txn, view)`` writes and reports -- once: a bootstrap makes a new table, so a
    write completed meanwhile leaves nothing to redo on the new snapshot (a rerun finds its
    batch committed, or the table holding data). ConflictError (exit 3) then, naming the
    conflict; the result's ``instant`` is None when a concurrent run committed the batch
    (``applied_by``)."""
    txn = Transaction(table, Action.BOOTSTRAP, plan, view=view, repair=True,
                      heartbeat_timeout_s=heartbeat_timeout_s).begin()
    return txn.run(lambda view, retries: attempt(txn, view), max_retries=0, batch_id=batch_id,
                   what="the bootstrap",
                   give_up="the bootstrap was not committed; nothing was written, run it again with the same batch id")


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
