"""``shadow-compare`` in-process: the comparison of :mod:`spark_jobs.jobs.shadow_compare`, on
Arrow tables, with the same report.

What is compared, what ``--since`` and ``--sample-fraction`` select, which samples a report
shows and every report field are :mod:`spark_jobs.table.shadow`'s rules; the reads are the
Spark job's task functions (:mod:`spark_jobs.kernels.tasks`) called in this process: the keys of
every live row with the file group whose file was opened (``read_file_keys``), the live
entries of an index bucket (``read_bucket_entries``), the fingerprints of the index files a
``--since`` touched (``shadow.index_file_fingerprints``), and the keys' fingerprints and
buckets (:mod:`spark_jobs.index.hashing`, as ``fingerprint_keys`` and ``bucket_expr`` compute
them). What the Spark job joins and groups is joined and grouped by Acero here.

The key scan is streamed file by file and the index read bucket by bucket: only the keys in
the comparison are kept -- with ``--since``, those the commits after the instant touched (and
the entries their fingerprints name), so the incremental check a scheduled DAG runs holds
about the changed keys, whatever the table's size. :func:`needed_bytes` is what
``--engine auto`` compares with the memory budget.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.arrow_engine import validate as arrow_validate
from spark_jobs.index.hashing import buckets_of, fingerprints
from spark_jobs.io.storage import redact_uri
from spark_jobs.kernels import tasks
from spark_jobs.table import shadow
from spark_jobs.table.config import INDEX_RECORD
from spark_jobs.table.shadow import ShadowOptions, Touched
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView
from spark_jobs.text import plural

__all__ = ["needed_bytes", "run_shadow_compare"]

log = logging.getLogger("bucketindex.shadow_compare")

KEY = tasks.KEY
_FILES = pa.schema([("path", pa.string()), ("part", pa.string()), ("fid", pa.string()),
                    ("logs", pa.list_(pa.string()))])
_DATA = pa.schema([(KEY, pa.string()), ("fp_hi", pa.int64()), ("fp_lo", pa.int64()), ("loc", pa.int32()),
                   ("pid", pa.int32())])
_TOUCHED = pa.schema([("fp_hi", pa.int64()), ("fp_lo", pa.int64()), ("bucket", pa.int64()), (KEY, pa.string())])
_ENTRIES = pa.schema([("bucket", pa.int64()), ("fp_hi", pa.int64()), ("fp_lo", pa.int64()),
                      ("i_loc", pa.int32()), ("i_pid", pa.int32())])
_FP = ["fp_hi", "fp_lo"]
#: what a ``--since`` comparison holds whatever its size: the readers' and Acero's buffers
#: (measured: 60-140 MiB above the interpreter, the larger on a 500k-row table)
SINCE_BASE_BYTES = 64 << 20


def needed_bytes(table: Table, view: FileSystemView, opts: ShadowOptions | None = None,
                 touched: Touched | None = None) -> int:
    """What :func:`run_shadow_compare` holds at its peak, estimated without opening a file.

    The full comparison holds what ``validate`` holds (every live key with its location and,
    for the record index, every live entry, joined): ``arrow_engine.validate.needed_bytes``.
    With ``--since`` (``touched``: :func:`shadow.touched_since`'s answer) it holds the keys
    the commits after the instant touched -- the rows their commits recorded, a few hundred
    bytes each, twice with the record index's entries -- plus what is in flight: the largest
    file slice's keys and one index bucket's entries before they are narrowed, and the readers'
    buffers (``SINCE_BASE_BYTES``)."""
    assert table.config is not None
    if touched is None:
        return arrow_validate.needed_bytes(table, view)
    record = table.config.index_type == INDEX_RECORD
    per_key = arrow_validate.ROW_BYTES + (arrow_validate.ENTRY_BYTES if record else 0)
    in_flight = max((s.num_rows + sum(lf.num_rows for lf in s.logs) for s in view.slices()), default=0)
    in_flight *= arrow_validate.ROW_BYTES
    if record:  # one bucket's entries, before they are narrowed (skew: twice the mean)
        in_flight += -(-view.num_rows // max(1, table.num_buckets(view))) * arrow_validate.ENTRY_BYTES * 2
    return SINCE_BASE_BYTES + touched.rows * per_key + in_flight


def run_shadow_compare(uri: str, opts: ShadowOptions | None = None, *,
                       touched: Touched | None = None) -> dict[str, Any]:
    """Compare and return the report (``spark_jobs.jobs.shadow_compare.run_shadow_compare``'s keys
    and values; ``ok`` False when mismatches exceed ``opts.max_mismatches``).

    Options are checked before anything is read (BadInputError: exit 2). ``touched``: what
    :func:`shadow.touched_since` answered for ``opts.since`` (the CLI computes it to size the
    work); computed here when not given."""
    start = time.monotonic()
    opts = opts or ShadowOptions()
    table = Table.load(uri)
    assert table.config is not None
    shadow.check_options(table.config.index_type, opts)
    view = table.view()
    instant = table.timeline.max_instant() or None
    if opts.since is not None and touched is None:
        touched = shadow.touched_since(table, opts.since)
    elif opts.since is None:
        touched = None
    keys_checked, found = _compare(table, view, opts, touched)
    report = shadow.build_report(table=table, index_type=table.config.index_type, instant=instant, opts=opts,
                                 keys_checked=keys_checked, found=found, touched=touched,
                                 elapsed_ms=int((time.monotonic() - start) * 1000))
    log.info("shadow-compare %s against %s: %s, %s (in-process)", redact_uri(uri), opts.against,
             plural(keys_checked, "key"), plural(report["mismatches"], "mismatch"))
    return report


def _compare(table: Table, view: FileSystemView, opts: ShadowOptions,
             touched: Touched | None) -> tuple[int, dict[str, Any]]:
    cfg = table.config
    assert cfg is not None
    nb = table.num_buckets(view)
    tkeys = _touched_keys(table, touched, nb) if touched is not None else None
    locations = _Locations()
    data = _data(table, view, opts, tkeys, locations)
    found: dict[str, Any] = {}
    if cfg.index_type == INDEX_RECORD:
        n = _compare_record(table, view, opts, data, tkeys, nb, locations, found)
    else:
        n = _compare_hashed(cfg.index_type, opts, data, nb, locations, found)
    return n, found


class _Locations:
    """Integer codes of locations, so rows and entries carry two ints through the joins rather
    than two strings: ``(partition, file group)`` -> ``loc``, partition -> ``pid``."""

    def __init__(self) -> None:
        self.locs: dict[tuple[str, str], int] = {}
        self.parts: dict[str, int] = {}
        self.fids: list[str] = []  # by loc

    def code(self, part: str, fid: str) -> tuple[int, int]:
        loc = self.locs.get((part, fid))
        if loc is None:
            loc = self.locs[(part, fid)] = len(self.locs)
            self.fids.append(fid)
        return loc, self.parts.setdefault(part, len(self.parts))

    def codes(self, part: pa.Array | pa.ChunkedArray, fid: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, pa.Array]:
        """``loc`` and ``pid`` of each row (no nulls: every row and live entry has a location)."""
        pe, fe = (pc.dictionary_encode(_combined(a)) for a in (part, fid))
        nf = max(1, len(fe.dictionary))
        pair = pe.indices.to_numpy().astype(np.int64) * nf + fe.indices.to_numpy()
        uniq, inverse = np.unique(pair, return_inverse=True)
        pd, fd = pe.dictionary.to_pylist(), fe.dictionary.to_pylist()
        codes = np.array([self.code(pd[c // nf], fd[c % nf]) for c in uniq.tolist()], np.int32).reshape(-1, 2)
        return pa.array(codes[inverse, 0]), pa.array(codes[inverse, 1])


def _combined(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a


# -- reads ---------------------------------------------------------------------------------

def _file_list(rels: list[str], parts: list[str], fids: list[str], logs: list[list[str]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"path": rels, "part": parts, "fid": fids, "logs": logs}, schema=_FILES)


def _with_fingerprints(keys: pa.RecordBatch | pa.Table) -> pa.Table:
    """``keys`` with ``fp_hi``/``fp_lo`` appended (``tasks.fingerprint_keys``)."""
    hi, lo = fingerprints(keys.column(KEY).to_pylist())
    t = pa.Table.from_batches([keys]) if isinstance(keys, pa.RecordBatch) else keys
    return t.append_column("fp_hi", pa.array(hi.view(np.int64))).append_column("fp_lo", pa.array(lo.view(np.int64)))


def _narrowed(t: pa.Table, opts: ShadowOptions, tkeys: pa.Table | None) -> pa.Table:
    """The rows of ``t`` in the comparison: in the sample, and touched after ``--since``."""
    mask = shadow.sample_mask(t.column("fp_hi").to_numpy(), opts.sample_fraction)
    if mask is not None:
        t = t.filter(pa.array(mask))
    if tkeys is not None and t.num_rows:
        t = t.join(tkeys.select(_FP), keys=_FP, join_type="left semi")
    return t


def _data(table: Table, view: FileSystemView, opts: ShadowOptions, tkeys: pa.Table | None,
          locations: _Locations) -> pa.Table:
    """``(_bi_key, fp_hi, fp_lo, loc, pid)`` for every live row in the comparison: the key scan of
    every live slice (``read_file_keys``), narrowed file by file."""
    slices = view.slices()
    out = []
    if slices:
        files = _file_list([s.path for s in slices], [s.partition for s in slices], [s.file_id for s in slices],
                           [[lf.path for lf in s.logs] for s in slices])
        for b in tasks.read_file_keys([files], table_uri=table.uri):  # a batch at a time, file by file
            if b.num_rows:
                t = _narrowed(_with_fingerprints(b), opts, tkeys)
                loc, pid = locations.codes(t.column("part"), t.column("fid"))
                out.append(t.select([KEY, "fp_hi", "fp_lo"]).append_column("loc", loc).append_column("pid", pid)
                           .cast(_DATA))
    return pa.concat_tables(out) if out else _DATA.empty_table()


def _touched_keys(table: Table, touched: Touched, nb: int) -> pa.Table:
    """``(fp_hi, fp_lo, bucket, key)`` once per fingerprint touched after ``--since``: keys read
    from the touched data files, fingerprints (no key) from the touched index files; the
    smallest bucket and key of a fingerprint, as the Spark job's ``min()`` keeps them."""
    parts = []
    if touched.data_files:
        n = len(touched.data_files)
        files = _file_list(touched.data_files, [""] * n, [""] * n, [[] for _ in range(n)])
        for b in tasks.read_file_keys([files], table_uri=table.uri):
            keys = b.column(KEY)
            t = _with_fingerprints(pa.table({KEY: keys}))
            parts.append(t.append_column("bucket", pa.array(buckets_of(keys.to_pylist(), nb), pa.int64()))
                         .select(_TOUCHED.names).cast(_TOUCHED))
    if touched.index_files:
        idx = pa.RecordBatch.from_pydict({"bucket": [b for b, _ in touched.index_files],
                                          "path": [p for _, p in touched.index_files]},
                                         schema=pa.schema([("bucket", pa.int32()), ("path", pa.string())]))
        for b in shadow.index_file_fingerprints([idx], table_uri=table.uri):
            parts.append(pa.table({"fp_hi": b.column("fp_hi"), "fp_lo": b.column("fp_lo"),
                                   "bucket": b.column("bucket").cast(pa.int64()),
                                   KEY: pa.nulls(b.num_rows, pa.string())}, schema=_TOUCHED))
    if not parts:
        return _TOUCHED.empty_table()
    g = pa.concat_tables(parts).group_by(_FP).aggregate([("bucket", "min"), (KEY, "min")])
    return g.rename_columns({"bucket_min": "bucket", f"{KEY}_min": KEY}).select(_TOUCHED.names)


def _entries(table: Table, view: FileSystemView, opts: ShadowOptions, tkeys: pa.Table | None,
             locations: _Locations) -> pa.Table:
    """The live entries (``_ENTRIES``) of the index buckets in the comparison -- with ``--since``,
    only the buckets the touched keys hash to -- narrowed bucket by bucket."""
    files = {b: list(f) for b, f in view.index_files.items() if f}
    if tkeys is not None:
        wanted = set(pc.unique(tkeys.column("bucket")).to_pylist())
        files = {b: f for b, f in files.items() if b in wanted}
    out = []
    for b in sorted(files):
        e = tasks.read_bucket_entries((pa.scalar(b, pa.int32()),), None, table_uri=table.uri, files=files)
        e = _narrowed(e, opts, tkeys)
        loc, pid = locations.codes(e.column("part"), e.column("fid"))
        out.append(e.select(["bucket", "fp_hi", "fp_lo"]).append_column("i_loc", loc).append_column("i_pid", pid)
                   .cast(_ENTRIES))
    return pa.concat_tables(out) if out else _ENTRIES.empty_table()


# -- comparisons ------------------------------------------------------------------------------

def _compare_record(table: Table, view: FileSystemView, opts: ShadowOptions, data: pa.Table,
                    tkeys: pa.Table | None, nb: int, locations: _Locations, found: dict[str, Any]) -> int:
    """Record index: per fingerprint, the live rows (with the bucket the key hashes to) full-joined
    with the live entry of that bucket -- the entry a lookup of the key would find."""
    data = data.append_column("bucket", pa.array(buckets_of(data.column(KEY).to_pylist(), nb), pa.int64()))
    entries = _entries(table, view, opts, tkeys, locations)
    on = ["fp_hi", "fp_lo", "bucket"]
    d = data.group_by(on).aggregate([([], "count_all"), (KEY, "min")])
    d = d.rename_columns({"count_all": "n", f"{KEY}_min": KEY})
    j = d.join(entries, keys=on, join_type="full outer", coalesce_keys=True)
    row, entry = pc.is_valid(j.column("n")), pc.is_valid(j.column("i_loc"))
    d_key = j.column(KEY)

    # the index's answer against the locations of the key's rows (one pair per row and entry):
    # wrong when none of the rows is where the entry says
    mine, answer = ("pid", "i_pid") if shadow.record_partition_only(opts) else ("loc", "i_loc")
    pairs = data.select([*on, mine]).join(entries.select([*on, answer]), keys=on, join_type="inner")
    pairs = pairs.select(on).append_column("same", pc.equal(pairs.column(mine), pairs.column(answer)))
    g = pairs.group_by(on).aggregate([("same", "any")])
    wrong = d.select([*on, KEY]).join(g.filter(pc.invert(g.column("same_any"))).select(on), keys=on,
                                      join_type="left semi")

    shadow.add_found(found, "missing", *_counted(pc.and_(row, pc.invert(entry)), d_key))
    shadow.add_found(found, "wrong_location", wrong.num_rows, _smallest(wrong.column(KEY)))
    extra = pc.invert(row)
    n_extra = _count(extra)
    if n_extra:
        shadow.add_found(found, "extra", n_extra, _extra_labels(j.filter(extra), tkeys))
    shadow.add_found(found, "duplicated", *_counted(pc.fill_null(pc.greater(j.column("n"), 1), False), d_key))
    return j.num_rows


def _extra_labels(extra: pa.Table, tkeys: pa.Table | None) -> list[str]:
    """The smallest names of entries without a row: the key a ``--since`` read, else the
    fingerprint (``shadow.fingerprint_labels``)."""
    named: list[str] = []
    if tkeys is not None:
        extra = extra.select(_FP).join(tkeys.select([*_FP, KEY]), keys=_FP, join_type="left outer")
        known = pc.is_valid(extra.column(KEY))
        named = _smallest(extra.column(KEY).filter(known))
        extra = extra.filter(pc.invert(known))
    hi = extra.column("fp_hi").to_numpy().view(np.uint64)
    lo = extra.column("fp_lo").to_numpy().view(np.uint64)
    first = np.lexsort((lo, hi))[:shadow.SAMPLES]  # the labels' string order is the unsigned order
    return named + shadow.fingerprint_labels(hi[first].tolist(), lo[first].tolist())


def _compare_hashed(index_type: str, opts: ShadowOptions, data: pa.Table, nb: int, locations: _Locations,
                    found: dict[str, Any]) -> int:
    """Bucket index (answer: file group ``hash(key) mod N`` of the row's partition) and
    global_simple (answer: wherever the row is): only wrong locations and duplicates can occur."""
    identity = [KEY if c == KEY else "pid" for c in shadow.hashed_identity(index_type, opts)]  # part: its code
    if shadow.hashed_answer_is_bucket(index_type):
        fid = pa.array(locations.fids, pa.string()).take(data.column("loc"))
        answer = pc.utf8_lpad(pa.array(buckets_of(data.column(KEY).to_pylist(), nb)).cast(pa.string()), 8, "0")
        wrong = pc.cast(pc.not_equal(fid, answer), pa.int8())
    else:
        wrong = pa.array(np.zeros(data.num_rows, np.int8))
    rows = data.select(identity).append_column("wrong", wrong)
    d = rows.group_by(identity).aggregate([([], "count_all"), ("wrong", "max")])
    shadow.add_found(found, "wrong_location",
                     *_counted(pc.fill_null(pc.equal(d.column("wrong_max"), 1), False), d.column(KEY)))
    shadow.add_found(found, "duplicated", *_counted(pc.greater(d.column("count_all"), 1), d.column(KEY)))
    return d.num_rows


def _counted(mask: pa.Array | pa.ChunkedArray, names: pa.Array | pa.ChunkedArray) -> tuple[int, list[Any]]:
    """How many rows ``mask`` selects, and the smallest of their ``names``."""
    n = _count(mask)
    return n, (_smallest(names.filter(mask)) if n else [])


def _count(mask: pa.Array | pa.ChunkedArray) -> int:
    return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)


def _smallest(values: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The ``SAMPLES`` smallest values, without sorting all of them."""
    if len(values) <= shadow.SAMPLES:
        return values.to_pylist()
    return values.take(pc.bottom_k_unstable(values, k=shadow.SAMPLES)).to_pylist()
