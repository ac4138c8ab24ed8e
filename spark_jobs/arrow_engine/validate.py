"""``validate`` in-process: the full index <-> data check of :mod:`spark_jobs.jobs.validate`,
on Arrow tables, with the same report.

The rules (what is a problem, how it is counted and sampled) are
:mod:`spark_jobs.table.validation`'s; the reads are the Spark job's task functions
(:mod:`spark_jobs.kernels.tasks`) called in this process: the keys of every live row with the
file group whose file was opened (``read_file_keys``), the live entries of every index
bucket (``read_bucket_entries``), and the keys' fingerprints and buckets
(:mod:`spark_jobs.index.hashing`, as ``fingerprint_keys`` and ``bucket_expr`` compute them).
What the Spark job joins and groups is joined and grouped by Acero here.

Memory is bounded by a budget (``--memory-budget``; default a quarter of physical memory). One
pass over the live slices counts each file group's rows and hashes each key once (bucket, and
for the record index its fingerprint); a snapshot whose :func:`needed_bytes` -- every live key
with its file group and, for the record index, every live entry, joined -- fit the budget is
checked at once. A larger one is split into P partitions (:func:`plan`): rows by their key's
fingerprint (record index) or bucket hash (bucket index), entries by their fingerprint, so a
key, its duplicates and its entry (however wrong its bucket) meet in one partition; each is
spilled to an Arrow IPC file in a temp dir (removed at the end, also on an error) and checked
alone. Samples are each partition's smallest, then the smallest of those: the report is the
same for any P. What it holds then is the largest slice's keys and index bucket's entries as
they are read plus one partition (:func:`stream_bytes`, :func:`bounded_bytes`), which is what
``--engine auto`` compares with the budget.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.exceptions import IndexCorruptError
from spark_jobs.index.hashing import buckets_of, fingerprints
from spark_jobs.kernels import tasks
from spark_jobs.table import validation
from spark_jobs.table.action.engine import IN_MEMORY_EXPANSION
from spark_jobs.table.action.engine import memory_budget as default_budget
from spark_jobs.table.config import INDEX_BUCKET, INDEX_RECORD
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView

__all__ = ["run_validate", "keys_with_location", "needed_bytes", "stream_bytes", "plan", "Plan", "bounded_bytes",
           "KEY_SHARE", "ROW_BYTES", "ENTRY_BYTES", "MAX_PARTITIONS"]

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
_FILES = pa.schema([("path", pa.string()), ("part", pa.string()), ("fid", pa.string()),
                    ("logs", pa.list_(pa.string()))])
#: the most partitions a run splits into (each is two open files while they are written)
MAX_PARTITIONS = 256


def needed_bytes(table: Table, view: FileSystemView) -> int:
    """What :func:`run_validate` holds in memory at its peak for ``view`` checked in one
    partition, estimated from the view's sizes and row counts (no file is opened): the key
    columns of its data files (bases and logs), decoded, a few hundred bytes per live row, and
    as much again per row for the record index's entries and their join with the rows. (Also
    what shadow-compare and rehash hold, reading every key at once.)"""
    assert table.config is not None
    data = sum(s.size + sum(lf.size for lf in s.logs) for s in view.slices())
    per_row = ROW_BYTES + (ENTRY_BYTES if table.config.index_type == INDEX_RECORD else 0)
    return data // KEY_SHARE * IN_MEMORY_EXPANSION + view.num_rows * per_row


def run_validate(table_uri: str, *, memory_budget: int | None = None, spill_dir: str | None = None) -> dict[str, Any]:
    """The ``validate`` report of the latest snapshot (``spark_jobs.jobs.validate.run_validate``'s keys and values).

    ``memory_budget``: the bytes it may hold (default: :func:`~spark_jobs.table.action.engine.memory_budget`);
    a snapshot whose :func:`needed_bytes` are over it is checked in :func:`plan`'s partitions,
    spilled under ``spill_dir`` (default: the system's temp dir) and removed at the end."""
    table = Table.load(table_uri)
    view = table.view()
    budget = default_budget() if memory_budget is None else memory_budget
    return _validate(table, view, partitions=plan(table, view, budget).partitions, spill_dir=spill_dir)


@dataclass(frozen=True)
class Plan:
    """How :func:`run_validate` checks a snapshot within a budget: in ``partitions`` (1: all rows
    and entries held at once, nothing spilled), holding about ``needed`` bytes at its peak."""

    partitions: int
    needed: int


def stream_bytes(table: Table, view: FileSystemView) -> int:
    """What a partitioned run holds besides one partition: the largest file slice's keys as
    they are read (decoded, with their hashes) and the largest index bucket's entries as they
    are read and spilled -- the floor no number of partitions lowers."""
    assert table.config is not None
    slices = view.slices()
    largest = max(slices, key=lambda s: s.size + sum(lf.size for lf in s.logs), default=None)
    held = 0 if largest is None else ((largest.size + sum(lf.size for lf in largest.logs)) // KEY_SHARE
                                      * IN_MEMORY_EXPANSION + largest.num_rows * ROW_BYTES)
    if table.config.index_type == INDEX_RECORD:
        held += -(-view.num_rows // max(1, table.num_buckets(view))) * ENTRY_BYTES * 2
    return held


def plan(table: Table, view: FileSystemView, budget: int) -> Plan:
    """The fewest partitions whose run fits ``budget``: 1 when :func:`needed_bytes` does (no
    spill); otherwise P so that :func:`stream_bytes` plus a P-th of :func:`needed_bytes` fits,
    at most ``MAX_PARTITIONS`` (``needed`` then stays over the budget: ``auto`` takes Spark)."""
    whole = needed_bytes(table, view)
    if whole <= budget:
        return Plan(1, whole)
    floor = stream_bytes(table, view)
    room = budget - floor
    p = MAX_PARTITIONS if room <= 0 else min(MAX_PARTITIONS, max(2, -(-whole // room)))
    return Plan(p, floor + -(-whole // p))


def bounded_bytes(table: Table, view: FileSystemView, budget: int) -> int:
    """What ``--engine auto`` compares with ``budget``: :func:`plan`'s peak (at most the budget
    whenever one partition and the largest slice and index bucket fit)."""
    return plan(table, view, budget).needed


def _validate(table: Table, view: FileSystemView, *, partitions: int = 1,
              spill_dir: str | None = None) -> dict[str, Any]:
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
    groups = _Groups(slices)
    record = cfg.index_type == INDEX_RECORD
    with _Spill(partitions, record=record, spill_dir=spill_dir) as spill:
        counts = _stream_rows(table, slices, groups, spill, nb=nb, record=record)
        if slices:
            report["rows"] = int(counts.sum())
            read = {groups.pairs[g]: int(n) for g, n in enumerate(counts.tolist()) if n}
            mismatches = validation.row_count_mismatches(view, read)
            validation.add_problem(problems, "row_count_mismatch", len(mismatches), mismatches)
        if record:
            report["index_entries"] = _stream_entries(table, view, damaged, problems, groups, spill)
        found: dict[str, list[Any]] = {}  # check -> [count, samples of every partition]
        for p in range(partitions):
            rows, entries = spill.load(p)
            if partitions > 1:
                log.info("validate: partition %d of %d: %d rows%s", p + 1, partitions, rows.num_rows,
                         f", {entries.num_rows} index entries" if record else "")
            if slices:
                _check_rows(found, rows, groups, cfg.index_type)
            if record:
                if damaged:  # a damaged bucket's keys: no entries to compare them with
                    rows = rows.filter(pc.invert(pc.is_in(rows.column("bucket"),
                                                          value_set=pa.array(sorted(damaged), pa.int32()))))
                _check_record_index(found, rows, entries)
            del rows, entries
    for name in _CHECKS.get(cfg.index_type, ("duplicate_keys",)):  # global_simple: no index to check
        if name in found:
            validation.add_problem(problems, name, found[name][0], found[name][1])
    return validation.finish(report)


#: the checks of the partitions, in report order, per index type
_CHECKS = {INDEX_BUCKET: ("duplicate_keys", "rows_in_wrong_bucket"),
           INDEX_RECORD: ("duplicate_keys", *validation.RECORD_INDEX_CHECKS)}


class _Groups:
    """The snapshot's file groups as small integers (``gid``): a row and an entry carry one
    instead of their partition and file id; an entry naming a group the view lacks gets one too."""

    def __init__(self, slices: list[Any]) -> None:
        self.pairs: list[tuple[str, str]] = []
        self.ids: dict[tuple[str, str], int] = {}
        for s in slices:
            self.id_of(s.partition, s.file_id)
        parts = sorted({p for p, _ in self.pairs}, key=lambda v: (v is None, v or ""))
        self._part_ids = {p: i for i, p in enumerate(parts)}

    def id_of(self, part: str, fid: str) -> int:
        key = (part, fid)
        if key not in self.ids:
            self.ids[key] = len(self.pairs)
            self.pairs.append(key)
        return self.ids[key]

    def ids_of(self, part: pa.Array, fid: pa.Array) -> pa.Array:
        """``gid`` of every ``(part, fid)``: new ones (entries naming no group of the view) added."""
        joined = pc.binary_join_element_wise(part, fid, "\x00")
        known = pa.array(["\x00".join(k) for k in self.pairs], pa.string())
        out = pc.index_in(joined, value_set=known)
        if out.null_count:
            for p, f in set(zip(part.filter(pc.is_null(out)).to_pylist(), fid.filter(pc.is_null(out)).to_pylist())):
                self.id_of(p, f)
            known = pa.array(["\x00".join(k) for k in self.pairs], pa.string())
            out = pc.index_in(joined, value_set=known)
        return out.cast(pa.int32())

    def part_ids(self) -> pa.Array:
        """Per ``gid``, its partition as an integer (the bucket index's duplicate identity)."""
        return pa.array([self._part_ids.get(p, -1) for p, _ in self.pairs], pa.int32())

    def fids(self) -> pa.Array:
        return pa.array([f for _, f in self.pairs], pa.string())


_ROW_SPILL = pa.schema([(KEY, pa.string()), ("gid", pa.int32()), ("bucket", pa.int32())])
_RECORD_ROW_SPILL = pa.schema([*_ROW_SPILL, ("fp_hi", pa.int64()), ("fp_lo", pa.int64())])
_ENTRY_SPILL = pa.schema([("bucket", pa.int32()), ("fp_hi", pa.int64()), ("fp_lo", pa.int64()), ("gid", pa.int32())])


class _Spill:
    """Rows and entries by partition: held (one partition) or in Arrow IPC files of a temp dir
    (``spill_dir``, default the system's), one per partition and side, removed on exit -- also on
    an error. A key goes to the partition of its fingerprint (record index: an entry meets its
    row however wrong its bucket) or of its bucket hash (bucket index)."""

    def __init__(self, partitions: int, *, record: bool, spill_dir: str | None) -> None:
        self.partitions, self.record, self.spill_dir = partitions, record, spill_dir
        self.row_schema = _RECORD_ROW_SPILL if record else _ROW_SPILL
        self._held: dict[str, list[pa.RecordBatch]] = {"rows": [], "entries": []}
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._writers: dict[tuple[str, int], Any] = {}

    def __enter__(self) -> "_Spill":
        if self.partitions > 1:
            self._dir = tempfile.TemporaryDirectory(prefix="bucketindex-validate-", dir=self.spill_dir)
            log.info("validate: %d partitions, spilled under %s", self.partitions, self._dir.name)
            try:
                for side, schema in (("rows", self.row_schema), ("entries", _ENTRY_SPILL)):
                    for p in range(self.partitions):
                        self._writers[side, p] = pa.ipc.new_file(self._path(side, p), schema)
            except BaseException:
                self.__exit__()
                raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._close()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def _close(self) -> None:
        for w in self._writers.values():
            w.close()
        self._writers = {}

    def _path(self, side: str, p: int) -> str:
        assert self._dir is not None
        return os.path.join(self._dir.name, f"{side}-{p:05d}.arrow")

    def add(self, side: str, batch: pa.RecordBatch, partition_of: np.ndarray | None) -> None:
        """``batch``'s rows to their partitions (``partition_of``: each row's; None: one partition)."""
        if self.partitions == 1:
            self._held[side].append(batch)
            return
        assert partition_of is not None
        order = np.argsort(partition_of, kind="stable")
        sizes = np.bincount(partition_of, minlength=self.partitions)
        ordered = batch.take(pa.array(order))
        start = 0
        for p, n in enumerate(sizes.tolist()):
            if n:
                self._writers[side, p].write_batch(ordered.slice(start, n))
            start += n

    def load(self, p: int) -> tuple[pa.Table, pa.Table]:
        """Partition ``p``'s rows and entries (its files closed and removed once read)."""
        self._close()
        schemas = {"rows": self.row_schema, "entries": _ENTRY_SPILL}
        if self.partitions == 1:
            out = tuple(pa.Table.from_batches(self._held[s], schema=schemas[s]) for s in ("rows", "entries"))
            self._held = {"rows": [], "entries": []}
            return out  # type: ignore[return-value]
        tables = []
        for side in ("rows", "entries"):
            path = self._path(side, p)
            with pa.OSFile(path, "rb") as f:
                tables.append(pa.ipc.open_file(f).read_all())
            os.remove(path)
        return tables[0], tables[1]


def _partition_of(fp_lo: np.ndarray, partitions: int) -> np.ndarray | None:
    return None if partitions == 1 else (fp_lo.view(np.uint64) % np.uint64(partitions)).astype(np.int64)


def _stream_rows(table: Table, slices: list[Any], groups: _Groups, spill: _Spill, *, nb: int,
                 record: bool) -> np.ndarray:
    """Read every live slice's keys (``tasks.read_file_keys``, a slice at a time), hash them
    once and spill them; returns the rows read per ``gid``."""
    counts = np.zeros(len(groups.pairs), dtype=np.int64)
    total, every = 0, max(1, len(slices) // 20)
    for i, s in enumerate(slices):
        gid = groups.ids[(s.partition, s.file_id)]
        files = pa.RecordBatch.from_pydict(
            {"path": [s.path], "part": [s.partition], "fid": [s.file_id], "logs": [[lf.path for lf in s.logs]]},
            schema=_FILES)  # one slice a task: its rows are this group's
        for b in tasks.read_file_keys([files], table_uri=table.uri):
            n = b.num_rows
            if not n:
                continue
            counts[gid] += n
            keys = b.column(KEY)
            text = keys.to_pylist()
            cols: dict[str, Any] = {KEY: keys, "gid": pa.array(np.full(n, gid, np.int32))}
            if record:
                cols["bucket"] = pa.array(buckets_of(text, nb).astype(np.int32))
                hi, lo = fingerprints(text)
                cols["fp_hi"], cols["fp_lo"] = pa.array(hi.view(np.int64)), pa.array(lo.view(np.int64))
                where = _partition_of(lo, spill.partitions)
            else:  # pmod(h, nb * P) is pmod(h, nb) plus nb times a partition
                wide = buckets_of(text, nb * spill.partitions)
                cols["bucket"] = pa.array((wide % nb).astype(np.int32))
                where = wide // nb if spill.partitions > 1 else None
            del text
            spill.add("rows", pa.RecordBatch.from_pydict(cols, schema=spill.row_schema), where)
            total += n
        if spill.partitions > 1 and ((i + 1) % every == 0 or i + 1 == len(slices)):
            log.info("validate: read %d of %d file slices, %d rows so far", i + 1, len(slices), total)
    return counts


def _stream_entries(table: Table, view: FileSystemView, damaged: set[int], problems: dict[str, Any],
                    groups: _Groups, spill: _Spill) -> int:
    """Every live entry of every index bucket (``read_bucket_entries``, a bucket at a time),
    spilled; returns how many.

    ``damaged`` buckets (a file that does not open) are skipped; a bucket whose file opens but
    whose entries do not read joins them (``damaged`` grows) and the finding names its file."""
    files = {b: list(f) for b, f in view.index_files.items() if f and b not in damaged}
    total = 0
    for i, b in enumerate(files):
        try:
            e = tasks.read_bucket_entries((pa.scalar(b, pa.int32()),), None, table_uri=table.uri, files=files)
        except IndexCorruptError as err:
            validation.add_index_problems(problems, [err])
            damaged.add(b)
            continue
        lo = e.column("fp_lo").to_numpy()
        batch = pa.RecordBatch.from_pydict(
            {"bucket": e.column("bucket").combine_chunks().cast(pa.int32()),
             "fp_hi": e.column("fp_hi").combine_chunks(), "fp_lo": e.column("fp_lo").combine_chunks(),
             "gid": groups.ids_of(e.column("part").combine_chunks(), e.column("fid").combine_chunks())},
            schema=_ENTRY_SPILL)
        del e
        spill.add("entries", batch, _partition_of(lo, spill.partitions))
        total += batch.num_rows
        if spill.partitions > 1:
            log.info("validate: read %d of %d index buckets, %d entries so far", i + 1, len(files), total)
    return total


def _found(found: dict[str, list[Any]], name: str, count: int, samples: list[Any]) -> None:
    """Add one partition's ``count`` and smallest samples of check ``name``."""
    if count:
        old = found.setdefault(name, [0, []])
        old[0] += count
        old[1] = sorted([*old[1], *samples])[:validation.SAMPLES]


def _check_rows(found: dict[str, list[Any]], rows: pa.Table, groups: _Groups, index_type: str) -> None:
    """``duplicate_keys`` and (bucket index) ``rows_in_wrong_bucket`` of one partition's rows."""
    if index_type == INDEX_BUCKET:  # a record is its key in its partition
        ident = pa.table({KEY: rows.column(KEY), "part": groups.part_ids().take(rows.column("gid"))})
    else:
        ident = rows.select([KEY])
    g = ident.group_by(list(ident.column_names)).aggregate([([], "count_all")])
    dups = g.filter(pc.greater(g.column("count_all"), 1)).column(KEY)
    _found(found, "duplicate_keys", len(dups), _smallest(dups))
    if index_type == INDEX_BUCKET:
        keys = rows.column(KEY)
        bucket_fid = pc.utf8_lpad(rows.column("bucket").cast(pa.string()), 8, "0")
        wrong = pc.fill_null(pc.not_equal(bucket_fid, groups.fids().take(rows.column("gid"))), False)
        _found(found, "rows_in_wrong_bucket", _count(wrong), _smallest(keys.filter(wrong)))


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


def _check_record_index(found: dict[str, list[Any]], rows: pa.Table, entries: pa.Table) -> None:
    """The record-index checks (``validation.RECORD_INDEX_CHECKS``) of one partition: the full
    outer join of its rows and entries on the fingerprint, with SQL's null semantics.

    Only the fingerprints and row numbers go through the join; each side's columns are then
    taken by row number (null where the other side has no match). A file group is its ``gid``
    on both sides: equal ids, equal partition and file id."""
    d = pa.table({"fp_hi": rows.column("fp_hi"), "fp_lo": rows.column("fp_lo"),
                  "d_row": pa.array(np.arange(rows.num_rows, dtype=np.int64))})
    i = pa.table({"fp_hi": entries.column("fp_hi"), "fp_lo": entries.column("fp_lo"),
                  "i_row": pa.array(np.arange(entries.num_rows, dtype=np.int64))})
    j = d.join(i, keys=["fp_hi", "fp_lo"], join_type="full outer", coalesce_keys=True)
    d_row, i_row = (j.column(c).combine_chunks() for c in ("d_row", "i_row"))
    d_key, d_gid, d_bucket = (rows.column(c).take(d_row) for c in (KEY, "gid", "bucket"))
    i_gid, i_bucket = (entries.column(c).take(i_row) for c in ("gid", "bucket"))
    both = pc.and_(pc.is_valid(d_row), pc.is_valid(i_row))

    def fingerprint(hit: pa.Array) -> list[str]:  # the entries' names: each one's, then the smallest
        h, l = (j.column(c).filter(hit) for c in ("fp_hi", "fp_lo"))
        return _smallest(pa.array([validation.fingerprint_sample(a, b) for a, b in zip(h.to_pylist(), l.to_pylist())],
                                  pa.string()))

    checks = {
        "keys_missing_from_index": (pc.is_null(i_row), d_key),
        "index_entries_without_row": (pc.is_null(d_row), fingerprint),
        "index_points_to_wrong_file": (pc.and_kleene(both, pc.not_equal(d_gid, i_gid)), d_key),
        "index_entries_in_wrong_bucket": (pc.and_kleene(both, pc.not_equal(i_bucket, d_bucket)), d_key),
    }
    assert tuple(checks) == validation.RECORD_INDEX_CHECKS
    for name, (cond, sample) in checks.items():
        hit = pc.fill_null(cond, False)
        n = _count(hit)
        if n:
            _found(found, name, n, sample(hit) if callable(sample) else _smallest(sample.filter(hit)))


def _count(mask: pa.Array | pa.ChunkedArray) -> int:
    return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)


def _smallest(values: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The ``SAMPLES`` smallest values, without sorting all of them."""
    if len(values) <= validation.SAMPLES:
        return values.to_pylist()
    return values.take(pc.bottom_k_unstable(values, k=validation.SAMPLES)).to_pylist()
