"""``validate`` in-process: the full index <-> data check of :mod:`spark_jobs.jobs.validate`,
on Arrow tables, with the same report.

The rules (what is a problem, how it is counted and sampled) are
:mod:`spark_jobs.table.validation`'s; the reads are the Spark job's task functions
(:mod:`spark_jobs.kernels.tasks`) called in this process: the keys of every live row with the
file group whose file was opened (``read_file_keys``), the live entries of every index
bucket (``read_bucket_entries``), and the keys' fingerprints and buckets
(:mod:`spark_jobs.index.hashing`, as ``fingerprint_keys`` and ``bucket_expr`` compute them).
What the Spark job joins and groups is joined and grouped by Acero here.

It holds the key column of every row (with its partition and file id) and, for the record
index, every live entry: :func:`needed_bytes` is what ``--engine auto`` compares with the
memory budget.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.exceptions import IndexCorruptError
from spark_jobs.index.hashing import buckets_of, fingerprints
from spark_jobs.kernels import tasks
from spark_jobs.table import validation
from spark_jobs.table.action.engine import IN_MEMORY_EXPANSION
from spark_jobs.table.config import INDEX_BUCKET, INDEX_RECORD
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView

__all__ = ["run_validate", "keys_with_location", "needed_bytes", "KEY_SHARE", "ROW_BYTES", "ENTRY_BYTES"]

log = logging.getLogger("bucketindex.validate")

KEY = validation.KEY
#: a data file's bytes per byte of its key column, planned for (the Spark job sizes its
#: shuffles the same way: keys only, a fraction of the table's bytes); the key text, decoded
KEY_SHARE = 4
#: bytes a live row takes besides its key text: its location, the reads' buffers and the
#: group-bys over the rows (measured: about 250 at 1M rows)
ROW_BYTES = 320
#: bytes a live record-index entry adds: the entry (fingerprint, bucket, location), the keys'
#: fingerprints and buckets, and the join of entries and rows (measured: about 280 at 1M rows)
ENTRY_BYTES = 320
_ROWS = pa.schema([(KEY, pa.string()), ("part", pa.string()), ("fid", pa.string())])
_ENTRIES = pa.schema([("bucket", pa.int32()), ("fp_hi", pa.int64()), ("fp_lo", pa.int64()),
                      ("part", pa.string()), ("fid", pa.string())])


def needed_bytes(table: Table, view: FileSystemView) -> int:
    """What :func:`run_validate` holds in memory at its peak for ``view``, estimated from the
    view's sizes and row counts (no file is opened): the key columns of its data files (bases
    and logs), decoded, a few hundred bytes per live row, and as much again per row for the
    record index's entries and their join with the rows."""
    assert table.config is not None
    data = sum(s.size + sum(lf.size for lf in s.logs) for s in view.slices())
    per_row = ROW_BYTES + (ENTRY_BYTES if table.config.index_type == INDEX_RECORD else 0)
    return data // KEY_SHARE * IN_MEMORY_EXPANSION + view.num_rows * per_row


def run_validate(table_uri: str) -> dict[str, Any]:
    """The ``validate`` report of the latest snapshot (``spark_jobs.jobs.validate.run_validate``'s keys and values)."""
    table = Table.load(table_uri)
    return _validate(table, table.view())


def _validate(table: Table, view: FileSystemView) -> dict[str, Any]:
    cfg = table.config
    assert cfg is not None
    nb = table.num_buckets(view)
    report, problems = validation.new_report(table, view)
    damaged = validation.check_index_files(table, view, problems)  # left out of the record-index checks
    if validation.check_files(table, view, problems):  # reading them would fail or read other rows
        return validation.finish(report)
    if validation.add_damaged(problems, _damaged(table, view, unreadable=damaged)):  # the same: their rows cannot be trusted
        return validation.finish(report)
    slices = view.slices()
    if not slices and not any(view.index_files.values()):
        return validation.finish(report)
    rows = keys_with_location(table, view) if slices else None
    if rows is not None:
        report["rows"] = rows.num_rows
        counts = rows.group_by(["part", "fid"]).aggregate([([], "count_all")])
        read = {(p, f): n for p, f, n in zip(*(counts.column(c).to_pylist() for c in ("part", "fid", "count_all")))}
        mismatches = validation.row_count_mismatches(view, read)
        validation.add_problem(problems, "row_count_mismatch", len(mismatches), mismatches)
        groups = rows.group_by(validation.duplicate_identity(cfg.index_type)).aggregate([([], "count_all")])
        dups = groups.filter(pc.greater(groups.column("count_all"), 1)).column(KEY)
        validation.add_problem(problems, "duplicate_keys", len(dups), _smallest(dups))
    if cfg.index_type == INDEX_BUCKET and rows is not None:
        keys = rows.column(KEY)
        bucket_fid = pc.utf8_lpad(pa.array(buckets_of(keys.to_pylist(), nb)).cast(pa.string()), 8, "0")
        wrong = pc.fill_null(pc.not_equal(bucket_fid, rows.column("fid")), False)
        validation.add_problem(problems, "rows_in_wrong_bucket", _count(wrong), _smallest(keys.filter(wrong)))
    if cfg.index_type == INDEX_RECORD:
        entries = _index_entries(table, view, damaged, problems)
        report["index_entries"] = entries.num_rows
        if damaged and rows is not None:  # a damaged bucket's keys: no entries to compare them with
            rows = rows.filter(pc.invert(pc.is_in(pa.array(buckets_of(rows.column(KEY).to_pylist(), nb), pa.int64()),
                                                  value_set=pa.array(sorted(damaged), pa.int64()))))
        _check_record_index(problems, rows, entries, nb)
    return validation.finish(report)


def _damaged(table: Table, view: FileSystemView, *, unreadable: set[int]) -> list[tuple[str, str]]:
    """``(path, why)`` of every damaged file of the snapshot: ``verify_files`` over all of them
    (but the index files of the ``unreadable`` buckets, reported already)."""
    files = pa.RecordBatch.from_pydict({"path": validation.files_to_verify(view, unreadable=unreadable)},
                                       schema=pa.schema([("path", pa.string())]))
    return [(p, w) for b in tasks.verify_files([files], table_uri=table.uri)
            for p, w in zip(b.column("path").to_pylist(), b.column("problem").to_pylist())]


def keys_with_location(table: Table, view: FileSystemView) -> pa.Table:
    """``(_bi_key, part, fid)`` for every live row: ``read_file_keys`` over every live slice."""
    slices = view.slices()
    files = pa.RecordBatch.from_pydict(
        {"path": [s.path for s in slices], "part": [s.partition for s in slices],
         "fid": [s.file_id for s in slices], "logs": [[lf.path for lf in s.logs] for s in slices]},
        schema=pa.schema([("path", pa.string()), ("part", pa.string()), ("fid", pa.string()),
                          ("logs", pa.list_(pa.string()))]))
    batches = list(tasks.read_file_keys([files], table_uri=table.uri))
    return pa.Table.from_batches(batches, schema=_ROWS) if batches else _ROWS.empty_table()


def _index_entries(table: Table, view: FileSystemView, damaged: set[int], problems: dict[str, Any]) -> pa.Table:
    """Every live entry of every index bucket (``ENTRY_SCHEMA``): ``read_bucket_entries`` per bucket.

    ``damaged`` buckets (a file that does not open) are skipped; a bucket whose file opens but
    whose entries do not read joins them (``damaged`` grows) and the finding names its file."""
    files = {b: list(f) for b, f in view.index_files.items() if f and b not in damaged}
    parts = []
    for b in files:
        try:
            parts.append(tasks.read_bucket_entries((pa.scalar(b, pa.int32()),), None, table_uri=table.uri,
                                                   files=files))
        except IndexCorruptError as e:
            validation.add_index_problems(problems, [e])
            damaged.add(b)
    return pa.concat_tables([p.cast(_ENTRIES) for p in parts]) if parts else _ENTRIES.empty_table()


def _check_record_index(problems: dict[str, Any], rows: pa.Table | None, entries: pa.Table, nb: int) -> None:
    """The record-index checks (``validation.RECORD_INDEX_CHECKS``) over the full outer join of
    the rows and the entries on the fingerprint, with SQL's null semantics.

    Only the fingerprints and row numbers go through the join; each side's columns are then
    taken by row number (null where the other side has no match)."""
    rows = rows if rows is not None else _ROWS.empty_table()
    keys = rows.column(KEY).to_pylist()  # once: the fingerprints and the buckets are hashed from it
    hi, lo = fingerprints(keys)  # as tasks.fingerprint_keys appends them
    data_bucket = pa.array(buckets_of(keys, nb), pa.int64())  # as bucket_expr computes it
    del keys
    d = pa.table({"fp_hi": pa.array(hi.view(np.int64)), "fp_lo": pa.array(lo.view(np.int64)),
                  "d_row": pa.array(np.arange(rows.num_rows, dtype=np.int64))})
    i = pa.table({"fp_hi": entries.column("fp_hi"), "fp_lo": entries.column("fp_lo"),
                  "i_row": pa.array(np.arange(entries.num_rows, dtype=np.int64))})
    j = d.join(i, keys=["fp_hi", "fp_lo"], join_type="full outer", coalesce_keys=True)
    d_row, i_row = (j.column(c).combine_chunks() for c in ("d_row", "i_row"))
    d_key, d_part, d_fid = (rows.column(c).take(d_row) for c in (KEY, "part", "fid"))
    i_part, i_fid, i_bucket = (entries.column(c).take(i_row) for c in ("part", "fid", "bucket"))
    d_bucket = data_bucket.take(d_row)
    both = pc.and_(pc.is_valid(d_fid), pc.is_valid(i_fid))
    wrong_file = pc.or_kleene(pc.not_equal(d_fid, i_fid), pc.not_equal(d_part, i_part))
    wrong_bucket = pc.not_equal(i_bucket.cast(pa.int64()), d_bucket)

    def fingerprint(hit: pa.Array) -> list[str]:  # the entries' names, only for those sampled
        h, l = (j.column(c).filter(hit) for c in ("fp_hi", "fp_lo"))
        return [validation.fingerprint_sample(a, b) for a, b in zip(h.to_pylist(), l.to_pylist())]

    checks = {
        "keys_missing_from_index": (pc.is_null(i_fid), d_key),
        "index_entries_without_row": (pc.is_null(d_fid), fingerprint),
        "index_points_to_wrong_file": (pc.and_kleene(both, wrong_file), d_key),
        "index_entries_in_wrong_bucket": (
            pc.and_kleene(pc.and_(pc.is_valid(i_bucket), pc.is_valid(d_bucket)), wrong_bucket), d_key),
    }
    assert tuple(checks) == validation.RECORD_INDEX_CHECKS
    for name, (cond, sample) in checks.items():
        hit = pc.fill_null(cond, False)
        n = _count(hit)
        if n:
            values = sample(hit) if callable(sample) else _smallest(sample.filter(hit))
            validation.add_problem(problems, name, n, values)


def _count(mask: pa.Array | pa.ChunkedArray) -> int:
    return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)


def _smallest(values: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The ``SAMPLES`` smallest values, without sorting all of them."""
    if len(values) <= validation.SAMPLES:
        return values.to_pylist()
    return values.take(pc.bottom_k_unstable(values, k=validation.SAMPLES)).to_pylist()
