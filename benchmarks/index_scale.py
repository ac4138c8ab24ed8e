"""RFC-08 at its own size: the record index alone, ``--buckets`` x ``--entries-per-bucket`` keys.

RFC-08 sizes Hudi's record-level index for 1,000 buckets of 1M entries (1 billion keys);
``index_lookup.py`` measures one such bucket. This script builds the whole index in
``--workdir`` with the product's writer (``record_index.write_index_file``, one base file per
bucket, at the path ``TableLayout.index_file`` gives it) and measures it as an upsert's tag
phase uses it.

**Keys.** Key ``i`` (0 <= i < buckets x entries-per-bucket) is a UUID4 string derived from
``(--seed, i)`` by a counter-based mix, so any key -- and its location, also derived from
``i`` -- can be regenerated without storing it. A key lives in the bucket the product routes
it to, ``pmod(xxhash64(key), buckets)`` (``arrow_engine.keys.bucket_ids``), so a bucket holds
about, not exactly, ``--entries-per-bucket`` keys. Misses are keys ``i >= N`` (never written).
Locations: ``--partitions`` x ``--files-per-partition`` (partition, file id) pairs with
realistic names, as in ``index_lookup.py``.

**Build (resumable).** Routing a billion keys one by one in Python takes ~10 minutes a pass,
so keys are generated and routed vectorised (numpy; the XXH64 of a 36-byte key is computed
in numpy, and a sample of every chunk checked against the product's ``bucket_ids``). A pass over all keys collects the
keys of as many unbuilt buckets as ``--pass-memory-mb`` holds (4 bytes a key), then writes
each of those buckets: fingerprints (the product's ``fingerprints`` of the key strings),
``write_index_file`` to a temporary name, renamed into place. A bucket whose file exists is
skipped, so an interrupted build resumes where it stopped (``--build-only`` to build,
``--no-build`` to measure what is built; progress is logged with rate and ETA).

**Measurements** (on the buckets built; all figures from the key strings):

* **tag lookups** of ``--lookups`` random hits and, separately, as many misses, spread over
  all built buckets: ``bucket_ids`` of the batch (the product's routing), keys grouped by
  bucket, ``record_index.lookup`` per bucket (local files) -- cold page cache (the index
  files' pages evicted first: ``posix_fadvise(DONTNEED)`` per file, or a global
  ``drop_caches`` with ``--cold drop_caches``; residency checked with ``fincore`` when
  available), *first* (right after: the open-file cache emptied, the pages left warm -- a new
  process on a machine that has read the index before) and warm (median of ``--runs`` runs);
  peak RSS of each (``VmHWM`` reset through ``/proc/self/clear_refs`` before it, RSS at start
  via psutil), and after the warm runs ``RssAnon`` and ``RssFile`` (mapped files' pages);
* **without a memory map**: the same hit batches through the generic FileIO (what HDFS and
  object stores get), counting read requests and bytes;
* **bytes per entry** on disk (index bytes / entries);
* **one bucket's compaction**: the first built bucket's base plus 3 deltas of 1% of its
  entries each (60% updates to new locations, 20% tombstones, 20% new keys), folded with
  ``compact_entries`` and written with ``write_index_file`` -- time and peak RSS;
* the tag phase's grouping at the largest batch: ``arrow_engine.keys.by_bucket`` (one sort,
  what ``ArrowEngine._tag`` uses since session 44) beside one ``filter`` of the whole batch per
  bucket (what it did before).

**The open-file cache** (``record_index``'s, kept between lookups of one process): warm runs
use it as a process tagging batch after batch would; ``--cache-mb`` sets its byte bound (0: no
cache, every lookup opens its files as ``IndexFile``). Since session 48 it holds each file's
resident summary (block offsets, every 64th ``fp_hi``, the location table: ~0.3 MB a 1M-entry
file, counted as such), not a mapping; before, it held mapped files, and the bound counted their
bytes (1,000 buckets of 18 MB against the default 1 GiB: no hits). The cold case empties it first
(a cached mapping would keep its pages resident through the eviction).

**Index file layout** (format.md §6): ``--index-layout`` 1 (default: what the product writes)
or 2 (the location table once, in the footer; written only when asked) for every file the run
writes -- the bases it builds and the compaction's deltas and base. A workdir holds one layout:
building more buckets into an index of the other layout is refused (exit status 2); the result
reports the layouts of the files it measured (``index_layouts``).

**Checks.** Every lookup's result is compared in full: every hit found at its expected
location, every miss absent; the compacted base against an oracle of the deltas. A failed
check raises (exit status 1). Progress goes to stdout; the last line is one JSON object.

    python benchmarks/index_scale.py --workdir /work/bench-index/rfc08 [--buckets 1000]
        [--entries-per-bucket 1000000] [--lookups 1000,100000,1000000] [--build-only | --no-build]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spark_jobs.arrow_engine.keys import bucket_ids, by_bucket  # noqa: E402
from spark_jobs.index.hashing import BUCKET_HASH_SEED, fingerprints  # noqa: E402
from spark_jobs.index.record_index import (  # noqa: E402
    CACHE_MAX_BYTES,
    INDEX_FILE_LAYOUT,
    INDEX_FILE_LAYOUTS,
    TOMBSTONE,
    IndexEntries,
    IndexFile,
    cache_info,
    clear_cache,
    compact_entries,
    lookup,
    set_cache_limits,
    write_index_file,
)
from spark_jobs.io.filesystem import resolve  # noqa: E402
from spark_jobs.table.layout import TableLayout  # noqa: E402
from machine_info import cpu_model, machine, mem_total_gb  # noqa: E402 (benchmarks/ is on sys.path)
from index_common import Checker, CountingFileIO, log, make_locations, status_kb  # noqa: E402
from results import emit_result  # noqa: E402

MANIFEST = "index_scale.json"
BUILD_LOG = "buckets.jsonl"
BASE_INSTANT = "00000000000001"
SUB_CHUNK = 1 << 14  # keys generated and hashed at a time: fits L2 (measured 110 ns/key, 260 at 1 << 16)
ROUTE_CHUNK = 1 << 22  # keys routed (grouped by bucket) at a time
MISS_OFFSET = 1 << 40  # miss ids start here: far above any key written
U64 = np.uint64
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
#: 16-bit value -> its four hex digits as one little-endian uint32 (first digit in the low byte)
_HEX4 = np.frombuffer(b"".join(f"{i:04x}".encode() for i in range(1 << 16)), "<u4")
_P1, _P2, _P3, _P4 = (U64(v) for v in (11400714785074694791, 14029467366897019727,
                                      1609587929392839161, 9650029242287828579))


# ---- keys: deterministic UUID4 strings, generated and routed with numpy -----------------------

def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64, so distinct counters give distinct keys."""
    z = x + U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


def key_words(ids: np.ndarray, seed: int) -> np.ndarray:
    """The UTF-8 text of keys ``ids`` -- canonical UUID4 strings, 36 bytes -- as a (9, n) array
    of little-endian uint32 words, word-major: each word a contiguous column, so that building
    it and hashing it are a few dozen whole-array numpy operations."""
    ids = np.asarray(ids, dtype=np.uint64)
    with np.errstate(over="ignore"):
        s = U64(seed) * U64(0xD1B54A32D192ED03)
        a = _mix64(ids * U64(2) + s)
        b = _mix64(ids * U64(2) + U64(1) + s)
    a = (a & U64(0xFFFFFFFFFFFF0FFF)) | U64(0x4000)  # version 4
    b = (b & U64(0x3FFFFFFFFFFFFFFF)) | U64(0x8000000000000000)  # RFC 4122 variant
    # hx[j]: the j-th group of 4 hex digits (16 bits of a, then of b) as one uint32
    hx = [_HEX4[((x >> U64(48 - 16 * k)) & U64(0xFFFF)).astype(np.intp)] for x in (a, b) for k in range(4)]
    u = np.uint32
    out = np.empty((9, ids.size), np.uint32)
    out[0], out[1] = hx[0], hx[1]  # digits 0-7
    out[2] = (hx[2] << u(8)) | u(0x2D)  # "-" + digits 8-10
    out[3] = (hx[2] >> u(24)) | u(0x2D00) | (hx[3] << u(16))  # 11 "-" 12 13
    out[4] = (hx[3] >> u(16)) | u(0x2D0000) | (hx[4] << u(24))  # 14 15 "-" 16
    out[5] = (hx[4] >> u(8)) | u(0x2D000000)  # 17-19 "-"
    out[6], out[7], out[8] = hx[5], hx[6], hx[7]  # digits 20-31
    return out


def key_bytes(ids: np.ndarray, seed: int) -> np.ndarray:
    """The UTF-8 bytes of keys ``ids`` as an (n, 36) uint8 array."""
    return np.ascontiguousarray(key_words(ids, seed).T).view(np.uint8)


def key_strings(ids: np.ndarray, seed: int) -> list[str]:
    """Keys ``ids`` as Python strings (one decode, then slices: 4x faster than numpy's ``astype(str)``)."""
    text = key_bytes(ids, seed).tobytes().decode("ascii")
    return [text[i:i + 36] for i in range(0, len(text), 36)]


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << U64(r)) | (x >> U64(64 - r))


def _round(acc, lane):
    return _rotl(acc + lane * _P2, 31) * _P1


def xxh64_36(words: np.ndarray, seed: int = BUCKET_HASH_SEED) -> np.ndarray:
    """XXH64 of each 36-byte key of ``words`` (:func:`key_words`) -- the reference algorithm
    specialised to 36 bytes: one 32-byte stripe of four 8-byte lanes, then a 4-byte tail;
    what ``xxhash.xxh64_intdigest`` gives (checked by :func:`route`)."""
    with np.errstate(over="ignore"):
        w = words.astype(np.uint64)
        lanes = [w[2 * j] | (w[2 * j + 1] << U64(32)) for j in range(4)]
        s = U64(seed)
        v = [_round(s + _P1 + _P2, lanes[0]), _round(s + _P2, lanes[1]),
             _round(s, lanes[2]), _round(s - _P1, lanes[3])]
        h = _rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)
        for x in v:
            h = (h ^ _round(U64(0), x)) * _P1 + _P4
        h = h + U64(36)
        h = _rotl(h ^ (w[8] * _P1), 23) * _P2 + _P3
        h ^= h >> U64(33)
        h *= _P2
        h ^= h >> U64(29)
        h *= _P3
        h ^= h >> U64(32)
    return h


def route(ids: np.ndarray, seed: int, buckets: int, *, verify: bool = False) -> np.ndarray:
    """The bucket of each key ``ids``: ``pmod(xxhash64(key), buckets)`` (Spark's and the Arrow
    engine's ``bucket_ids``), vectorised. ``verify``: also compare a sample with the product's
    own ``bucket_ids`` and raise on any difference."""
    out = np.empty(ids.size, np.int64)
    for s in range(0, ids.size, SUB_CHUNK):
        out[s:s + SUB_CHUNK] = np.mod(xxh64_36(key_words(ids[s:s + SUB_CHUNK], seed)).view(np.int64),
                                      np.int64(buckets))
    if verify and ids.size:
        pick = np.linspace(0, ids.size - 1, min(ids.size, 64)).astype(np.int64)
        want = bucket_ids(pa.array(key_strings(ids[pick], seed)), buckets)
        if not np.array_equal(out[pick], want):
            raise AssertionError("vectorised routing disagrees with arrow_engine.keys.bucket_ids")
    return out


def location_of(ids: np.ndarray, seed: int, n_locations: int) -> np.ndarray:
    """The location (index into the location list) key ``ids`` maps to."""
    with np.errstate(over="ignore"):
        h = _mix64(np.asarray(ids, np.uint64) ^ _mix64(np.full(1, seed + 0x5EED, np.uint64)))
    return (h % U64(n_locations)).astype(np.int64)


# ---- the index on disk ------------------------------------------------------------------------

class Index:
    """The index under ``workdir``: one base file per bucket, and what the build logged."""

    def __init__(self, workdir: str, args: argparse.Namespace) -> None:
        self.io, root = resolve(workdir)
        self.root = root
        self.layout = TableLayout(root)
        self.buckets = args.buckets
        self.n = args.buckets * args.entries_per_bucket
        self.seed = args.seed
        self.locations = make_locations("0", args.partitions, args.files_per_partition)

    def path(self, b: int) -> str:
        return self.layout.index_file(b, "base", BASE_INSTANT)

    def built(self) -> list[int]:
        return [b for b in range(self.buckets) if os.path.exists(self.path(b))]

    def layouts(self, buckets: list[int]) -> list[int]:
        """The index file layouts (format.md §6) of these buckets' files, read from the files."""
        found = set()
        for b in buckets:
            with IndexFile(self.io, self.path(b)) as f:
                found.add(int(f.metadata.get("layout", 1)))
        return sorted(found)

    def stats(self) -> dict[int, dict]:
        """Per built bucket: entries and bytes (from the build log; a bucket missing from it --
        renamed into place just before an interruption -- read from its file)."""
        got: dict[int, dict] = {}
        log_path = os.path.join(self.root, BUILD_LOG)
        if os.path.exists(log_path):
            with open(log_path) as f:
                for line in f:
                    if line.strip():
                        r = json.loads(line)
                        got[r["bucket"]] = r
        out = {}
        for b in self.built():
            r = got.get(b)
            if r is None:
                with IndexFile(self.io, self.path(b)) as f:
                    r = {"bucket": b, "entries": f.num_entries, "bytes": os.path.getsize(self.path(b))}
            out[b] = r
        return out


def check_manifest(workdir: str, args: argparse.Namespace) -> None:
    """Refuse to resume an index built with other parameters (its keys would differ)."""
    want = {"buckets": args.buckets, "entries_per_bucket": args.entries_per_bucket, "seed": args.seed,
            "partitions": args.partitions, "files_per_partition": args.files_per_partition}
    path = os.path.join(workdir, MANIFEST)
    if os.path.exists(path):
        with open(path) as f:
            have = json.load(f)
        if have != want:
            diff = ", ".join(f"{k} {have.get(k)} (asked {v})" for k, v in want.items() if have.get(k) != v)
            sys.stderr.write(f"index_scale: {workdir} holds an index built with other parameters: {diff}\n")
            raise SystemExit(2)
    else:
        os.makedirs(workdir, exist_ok=True)
        with open(path, "w") as f:
            json.dump(want, f)


def build(index: Index, args: argparse.Namespace) -> dict:
    """Write every bucket not written yet, in passes over all keys; returns build figures."""
    for b in range(index.buckets):  # leftovers of an interrupted write
        d = index.layout.index_bucket_dir(b)
        if os.path.isdir(d):
            for name in os.listdir(d):
                if name.endswith(".tmp"):
                    os.remove(os.path.join(d, name))
    missing = [b for b in range(index.buckets) if not os.path.exists(index.path(b))]
    skipped = index.buckets - len(missing)
    todo = missing if args.max_buckets is None else missing[:args.max_buckets]
    if todo and skipped:  # one layout per index: a mixed one would measure neither
        have = index.layouts(index.built()[:1])
        if have != [args.index_layout]:
            sys.stderr.write(f"index_scale: {index.root} holds index files of layout {have[0]}; "
                             f"asked to build layout {args.index_layout} (use another --workdir)\n")
            raise SystemExit(2)
    log(f"build: {index.buckets:,} buckets x ~{args.entries_per_bucket:,} keys = {index.n:,} keys; "
        f"{skipped:,} buckets already built (skipped), {len(todo):,} to build now")
    if not todo:
        return {"built_now": 0, "skipped": skipped}
    per_pass = max(1, int(args.pass_memory_mb * 2**20 / (4.4 * args.entries_per_bucket)))
    id_type = np.uint32 if index.n < 2**32 else np.uint64
    t_start = time.perf_counter()
    route_s = write_s = 0.0
    written = 0
    log_path = os.path.join(index.root, BUILD_LOG)
    for p0 in range(0, len(todo), per_pass):
        group = todo[p0:p0 + per_pass]
        wanted = np.full(index.buckets, -1, np.int64)
        wanted[group] = np.arange(len(group))
        parts: list[list[np.ndarray]] = [[] for _ in group]
        t0 = time.perf_counter()
        last = t0
        for c in range(0, index.n, ROUTE_CHUNK):
            ids = np.arange(c, min(c + ROUTE_CHUNK, index.n), dtype=np.uint64)
            slot = wanted[route(ids, index.seed, index.buckets, verify=True)]
            keep = np.nonzero(slot >= 0)[0]
            # slots fit 16 bits at the default pass size: numpy's stable sort is then a radix sort
            order = np.argsort(slot[keep].astype(np.int16 if len(group) < 2**15 else np.int64), kind="stable")
            kept, ks = ids[keep[order]].astype(id_type), slot[keep[order]]
            bounds = np.searchsorted(ks, np.arange(len(group) + 1))
            for j in np.nonzero(np.diff(bounds))[0].tolist():
                parts[j].append(kept[bounds[j]:bounds[j + 1]])
            now = time.perf_counter()
            if now - last > 30:
                last = now
                done = (c + ids.size) / index.n
                log(f"  pass {p0 // per_pass + 1}: routed {c + ids.size:,} of {index.n:,} keys "
                    f"({(c + ids.size) / (now - t0) / 1e6:.1f} M keys/s, pass ETA {(now - t0) * (1 / done - 1):.0f} s)")
        route_s += time.perf_counter() - t0
        log(f"pass {p0 // per_pass + 1}: routed {index.n:,} keys to {len(group)} buckets in {time.perf_counter() - t0:.0f} s")
        for j, b in enumerate(group):
            t1 = time.perf_counter()
            ids = np.concatenate(parts[j]) if parts[j] else np.empty(0, id_type)
            parts[j] = []
            hi, lo = fingerprints(key_strings(ids, index.seed))
            loc = location_of(ids, index.seed, len(index.locations)).astype(np.int32)
            entries = IndexEntries(hi, lo, loc, index.locations)
            final = index.path(b)
            index.io.mkdirs(index.layout.index_bucket_dir(b))
            size = write_index_file(index.io, final + ".tmp", entries, layout=args.index_layout,
                                    metadata={"instant": BASE_INSTANT, "bucket": b, "sealed": False})
            os.replace(final + ".tmp", final)
            with open(log_path, "a") as f:
                f.write(json.dumps({"bucket": b, "entries": int(ids.size), "bytes": size}) + "\n")
            write_s += time.perf_counter() - t1
            written += 1
            elapsed = time.perf_counter() - t_start
            left = len(todo) - written
            # ETA: the remaining buckets' writes plus the routing of the passes still to come
            passes_left = -(-(len(todo) - p0 - len(group)) // per_pass)
            eta = left * write_s / written + passes_left * route_s / (p0 // per_pass + 1)
            if written % 10 == 0 or left == 0:
                log(f"  bucket {b:5d}: {ids.size:,} entries, {size:,} bytes; built {written:,}/{len(todo):,} "
                    f"({written / elapsed * 60:.1f} buckets/min, {written * args.entries_per_bucket / elapsed / 1e3:.0f}k "
                    f"keys/s), ETA {eta / 60:.1f} min")
        del parts
        gc.collect()
    total = time.perf_counter() - t_start
    log(f"build: {written:,} buckets in {total:.0f} s (routing {route_s:.0f} s, writing {write_s:.0f} s)")
    return {"built_now": written, "skipped": skipped, "build_s": round(total, 1), "route_s": round(route_s, 1),
            "write_s": round(write_s, 1), "buckets_per_pass": per_pass}


# ---- measuring --------------------------------------------------------------------------------

def reset_peak() -> bool:
    """Reset this process's peak RSS (VmHWM) so the next reading is the peak since now."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def evict(paths: list[str], how: str) -> str:
    """Take the index files' pages out of the page cache; returns how it was done. The open-file
    cache is emptied first: pages mapped by a cached file are not evicted."""
    clear_cache()
    gc.collect()
    if how == "drop_caches":
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return "drop_caches"
        except OSError as e:
            log(f"drop_caches not permitted ({e.strerror}); evicting the index files only")
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages (a bucket just written) are not evicted
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise_dontneed"


def resident_fraction(paths: list[str]) -> float | None:
    """Fraction of the files' bytes in the page cache (``fincore``), or None without it."""
    fincore = shutil.which("fincore")
    if not fincore or not paths:
        return None
    try:
        out = subprocess.run([fincore, "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE", *paths],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    res = size = 0
    for line in out.splitlines():
        r, s = line.split()
        res, size = res + int(r), size + int(s)
    return round(min(1.0, res / size), 4) if size else None


def sample_ids(index: Index, built: np.ndarray, k: int, rng: np.random.Generator, *, miss: bool) -> np.ndarray:
    """``k`` distinct key ids whose bucket is built: written keys (hits) or never-written ones."""
    lo, hi = (MISS_OFFSET, MISS_OFFSET + (1 << 40)) if miss else (0, index.n)
    is_built = np.zeros(index.buckets, bool)
    is_built[built] = True
    got = np.empty(0, np.uint64)
    while got.size < k:
        cand = np.unique(rng.integers(lo, hi, size=int((k - got.size) * index.buckets / built.size * 1.1) + 64,
                                      dtype=np.uint64))
        cand = cand[is_built[route(cand, index.seed, index.buckets)]]
        got = np.union1d(got, cand)
    return rng.permutation(got)[:k]


class Tagger:
    """An upsert's tag phase against the index: route the batch's keys to buckets, look up
    each bucket's keys in its files."""

    def __init__(self, index: Index, io, built: list[int]) -> None:
        self.index = index
        self.io = io
        self.files = {b: [index.path(b)] for b in built}

    def __call__(self, keys: pa.Array) -> tuple[list, dict]:
        c0 = time.process_time()
        t0 = time.perf_counter()
        b = bucket_ids(keys, self.index.buckets)
        order = np.argsort(b, kind="stable")
        sb = b[order]
        uniq, starts = np.unique(sb, return_index=True)
        ends = np.append(starts[1:], sb.size)
        grouped = keys.take(pa.array(order))
        t1 = time.perf_counter()
        results = []
        for u, s, e in zip(uniq.tolist(), starts.tolist(), ends.tolist()):
            if u in self.files:
                results.append((order[s:e], lookup(self.io, self.files[u], grouped.slice(s, e - s).to_pylist())))
        t2 = time.perf_counter()
        # CPU seconds of the process: what the wall time is on an idle machine when no page is
        # read from disk (warm), however many other processes share the cores
        return results, {"route_ms": (t1 - t0) * 1000, "lookup_ms": (t2 - t1) * 1000, "total_ms": (t2 - t0) * 1000,
                         "cpu_ms": (time.process_time() - c0) * 1000}


def check_results(results: list, checker: Checker, expected: np.ndarray, what: str) -> None:
    """Every query answered once; every hit at its expected location, every miss absent."""
    got = np.full(expected.size, -3, np.int64)
    for pos, res in results:
        got[pos] = checker.global_ids(res)
    if (got == -3).any():
        raise AssertionError(f"{what}: {int(np.count_nonzero(got == -3))} keys not looked up (bucket not built?)")
    if not np.array_equal(got, expected):
        bad = got != expected
        raise AssertionError(f"{what}: {int(np.count_nonzero(bad))} of {expected.size} keys wrong "
                             f"({int(np.count_nonzero(bad & (expected < 0)))} misses found, "
                             f"{int(np.count_nonzero(bad & (expected >= 0) & (got < 0)))} hits not found)")


def measure_lookups(index: Index, built: list[int], args, rng) -> tuple[list[dict], dict]:
    io = index.io
    paths = [index.path(b) for b in built]
    tag = Tagger(index, io, built)
    checker = Checker(index.locations)
    barr = np.array(built, np.int64)
    rows = []
    batches = {}
    for k in args.lookups:
        for kind in ("hit", "miss"):
            ids = sample_ids(index, barr, k, rng, miss=kind == "miss")
            keys = pa.array(key_strings(ids, index.seed))
            expected = location_of(ids, index.seed, len(index.locations)) if kind == "hit" else np.full(k, -1)
            batches[(k, kind)] = (keys, expected)
            how = evict(paths, args.cold)
            resident = resident_fraction(paths[:50])
            gc.collect()
            rss0 = psutil.Process().memory_info().rss
            reset_peak()
            res, cold = tag(keys)
            peak_cold = status_kb("VmHWM") * 1024
            check_results(res, checker, expected, f"{kind} {k:,} cold")
            del res
            # first lookup of a process whose page cache is warm (a new task on a busy machine):
            # the open-file cache emptied, the index's pages left where the cold run put them
            clear_cache()
            gc.collect()
            res, first = tag(keys)
            check_results(res, checker, expected, f"{kind} {k:,} first")
            del res
            warm, peak_warm = [], 0
            for _ in range(args.runs):
                gc.collect()
                reset_peak()
                res, t = tag(keys)
                peak_warm = max(peak_warm, status_kb("VmHWM") * 1024)
                check_results(res, checker, expected, f"{kind} {k:,} warm")
                del res
                warm.append(t)
            med = {f: round(statistics.median(t[f] for t in warm), 1)
                   for f in ("total_ms", "route_ms", "lookup_ms", "cpu_ms")}
            row = {"keys": k, "kind": kind, "cold_ms": round(cold["total_ms"], 1),
                   "cold_route_ms": round(cold["route_ms"], 1), "first_ms": round(first["total_ms"], 1),
                   "first_cpu_ms": round(first["cpu_ms"], 1), "warm_ms": med["total_ms"], "warm_cpu_ms": med["cpu_ms"],
                   "warm_route_ms": med["route_ms"], "warm_lookup_ms": med["lookup_ms"],
                   "warm_runs_ms": [round(t["total_ms"], 1) for t in warm], "evicted_by": how,
                   "resident_before_cold": resident, "rss_start_mb": round(rss0 / 2**20, 1),
                   "peak_rss_cold_mb": round(peak_cold / 2**20, 1), "peak_rss_warm_mb": round(peak_warm / 2**20, 1),
                   # after the warm runs: the heap, and pages of mapped files (the index's, when kept mapped)
                   "rss_anon_mb": round(status_kb("RssAnon") / 1024, 1), "rss_file_mb": round(status_kb("RssFile") / 1024, 1),
                   "load": [round(x, 2) for x in os.getloadavg()],
                   "buckets_touched": int(np.unique(bucket_ids(keys, index.buckets)).size), "checked": True}
            rows.append(row)
            log(f"lookup {k:>9,} {kind + ('es' if kind == 'miss' else 's')} over {row['buckets_touched']:,} buckets: cold {row['cold_ms']:,.1f} ms "
                f"(resident before {resident}), first {row['first_ms']:,.1f} ms (CPU {row['first_cpu_ms']:,.1f}), "
                f"warm {row['warm_ms']:,.1f} ms (CPU {row['warm_cpu_ms']:,.1f}) "
                f"{row['warm_runs_ms']} (routing {row['warm_route_ms']:,.1f} ms), peak RSS {row['peak_rss_cold_mb']:,.0f} / "
                f"{row['peak_rss_warm_mb']:,.0f} MB (anon {row['rss_anon_mb']:,.0f}, file {row['rss_file_mb']:,.0f}); "
                f"load {row['load'][0]}; checked")
    return rows, batches


def measure_no_mmap(index: Index, built: list[int], batches: dict, args) -> list[dict]:
    """The hit batches through the generic FileIO (no memory map), counting read requests."""
    cio = CountingFileIO()
    tag = Tagger(index, cio, built)
    checker = Checker(index.locations)
    rows = []
    for k in args.no_mmap_lookups:
        if (k, "hit") not in batches:
            continue
        keys, expected = batches[(k, "hit")]
        cio.counter.update(reads=0, bytes=0)
        gc.collect()
        reset_peak()
        res, t = tag(keys)
        peak = status_kb("VmHWM") * 1024
        check_results(res, checker, expected, f"no-mmap {k:,}")
        modes = sorted({r.mode for _, r in res})
        row = {"keys": k, "ms": round(t["total_ms"], 1), "reads": cio.counter["reads"],
               "read_mb": round(cio.counter["bytes"] / 1e6, 1), "modes": modes, "buckets": len(res),
               "peak_rss_mb": round(peak / 2**20, 1), "checked": True}
        rows.append(row)
        log(f"no mmap {k:>9,} hits: {row['ms']:,.1f} ms, {row['reads']:,} read requests, {row['read_mb']:,} MB read "
            f"(modes {modes}), peak RSS {row['peak_rss_mb']:,.0f} MB; checked")
    return rows


def measure_compaction(index: Index, b: int, args, rng: np.random.Generator, scratch: str) -> dict:
    """Fold 3 deltas (1% of the bucket each) into bucket ``b``'s base, as index compaction does."""
    io = index.io
    base = index.path(b)
    with IndexFile(io, base) as f:
        e = f.entries()
    n = len(e)
    per = max(10, n // 100)
    dlocs = make_locations("d", args.partitions, 5)
    all_locs = index.locations + dlocs
    # new keys of this bucket: never-written ids that route here
    pool = sample_ids(index, np.array([b]), 3 * (per - int(per * 0.6) - int(per * 0.2)), rng, miss=True)
    nhi, nlo = fingerprints(key_strings(pool, index.seed))
    state: dict[tuple[int, int], int] = {}  # touched key -> newest global location (-1 deleted)
    glob_of = {loc: i for i, loc in enumerate(index.locations)}
    base_glob = np.array([glob_of[loc] for loc in e.locations], np.int64)[e.loc]
    os.makedirs(scratch, exist_ok=True)
    paths = [base]
    used_new = 0
    for d in range(3):
        n_upd, n_del = int(per * 0.6), int(per * 0.2)
        n_new = per - n_upd - n_del
        touched = rng.choice(n, n_upd + n_del, replace=False)
        hi = np.concatenate([e.fp_hi[touched], nhi[used_new:used_new + n_new]])
        lo = np.concatenate([e.fp_lo[touched], nlo[used_new:used_new + n_new]])
        used_new += n_new
        glob = np.concatenate([len(index.locations) + rng.integers(0, len(dlocs), n_upd), np.full(n_del, -1),
                               len(index.locations) + rng.integers(0, len(dlocs), n_new)])
        loc = np.where(glob >= 0, glob, TOMBSTONE).astype(np.int32)
        p = os.path.join(scratch, f"delta_{d + 2:014d}.arrow")
        write_index_file(io, p, IndexEntries(hi, lo, loc, all_locs), layout=args.index_layout)
        paths.append(p)
        for h, l_, g in zip(hi.tolist(), lo.tolist(), glob.tolist()):
            state[(h, l_)] = g
    gc.collect()
    reset_peak()
    rss0 = status_kb("VmRSS") * 1024
    t0 = time.perf_counter()
    merged = compact_entries(io, paths)
    t1 = time.perf_counter()
    out = os.path.join(scratch, "base_compacted.arrow")
    size = write_index_file(io, out, merged, metadata={"instant": "compacted", "bucket": b, "sealed": False},
                            layout=args.index_layout)
    t2 = time.perf_counter()
    peak = status_kb("VmHWM") * 1024
    # oracle: untouched base keys keep their location; touched keys have their newest state
    base_keys = set(zip(e.fp_hi.tolist(), e.fp_lo.tolist()))
    live = n + sum(1 for k, g in state.items() if g >= 0 and k not in base_keys) - sum(
        1 for k, g in state.items() if g < 0 and k in base_keys)
    if len(merged) != live:
        raise AssertionError(f"compaction of bucket {b}: {len(merged):,} live entries, expected {live:,}")
    tk = list(state)
    thi = np.array([k[0] for k in tk], np.uint64)
    tlo = np.array([k[1] for k in tk], np.uint64)
    want = np.array([state[k] for k in tk], np.int64)
    sample = rng.choice(n, min(n, 10_000), replace=False)
    shi, slo = e.fp_hi[sample], e.fp_lo[sample]
    swant = np.array([state.get(k, g) for k, g in zip(zip(shi.tolist(), slo.tolist()), base_glob[sample].tolist())])
    res = lookup(io, [out], fp=(np.concatenate([thi, shi]), np.concatenate([tlo, slo])))
    Checker(all_locs).check(res, np.concatenate([want, swant]), f"compaction of bucket {b}")
    r = {"bucket": b, "base_entries": n, "deltas": 3, "delta_entries_each": per, "merge_ms": round((t1 - t0) * 1000, 1),
         "write_ms": round((t2 - t1) * 1000, 1), "total_ms": round((t2 - t0) * 1000, 1), "entries_after": len(merged),
         "bytes_after": size, "peak_rss_growth_mb": round((peak - rss0) / 2**20, 1), "checked": True}
    log(f"compaction of bucket {b}: base {n:,} + 3 deltas of {per:,}: merge {r['merge_ms']:,.0f} ms + write "
        f"{r['write_ms']:,.0f} ms = {r['total_ms']:,.0f} ms, {len(merged):,} entries, peak RSS growth "
        f"{r['peak_rss_growth_mb']:,.0f} MB; checked")
    shutil.rmtree(scratch, ignore_errors=True)
    return r


def open_cost_ms(index: Index, built: list[int]) -> float:
    """Opening and closing every built bucket's file once, warm (median of 3): the fixed part
    of a lookup per bucket (memory map, Arrow IPC footer, location table, block index)."""
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        for b in built:
            IndexFile(index.io, index.path(b)).close()
        ts.append(time.perf_counter() - t0)
    return round(statistics.median(ts) * 1000 / len(built), 3)


def engine_grouping_ms(keys: pa.Array, buckets: int) -> dict:
    """The batch grouped by bucket as ``ArrowEngine._tag`` did before session 44 (one filter over
    the whole batch per bucket: keys x buckets work) and as it does now (``by_bucket``: one
    sort); the two groupings are checked equal."""
    b = bucket_ids(keys, buckets)
    t0 = time.perf_counter()
    by = {int(u): keys.filter(pa.array(b == u)) for u in np.unique(b)}
    t1 = time.perf_counter()
    by2 = dict(by_bucket(keys, b))
    t2 = time.perf_counter()
    assert by.keys() == by2.keys() and all(by[u].equals(by2[u]) for u in by)
    return {"keys": len(keys), "filter_per_bucket_ms": round((t1 - t0) * 1000, 1), "sort_ms": round((t2 - t1) * 1000, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True, help="where the index lives (kept between runs: resumable)")
    ap.add_argument("--buckets", type=int, default=1000)
    ap.add_argument("--entries-per-bucket", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=20)
    ap.add_argument("--files-per-partition", type=int, default=50)
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--lookups", default="1000,100000,1000000", help="batch sizes (keys), comma-separated")
    ap.add_argument("--no-mmap-lookups", default=None, help="batch sizes through the generic FileIO (default: --lookups)")
    ap.add_argument("--runs", type=int, default=3, help="warm runs per batch (median)")
    ap.add_argument("--cold", choices=("fadvise", "drop_caches"), default="fadvise",
                    help="how the cold case empties the page cache: the index files' pages only "
                         "(posix_fadvise DONTNEED), or every cached page of the machine")
    ap.add_argument("--pass-memory-mb", type=int, default=1024, help="key ids held per routing pass")
    ap.add_argument("--cache-mb", type=int, default=CACHE_MAX_BYTES >> 20,
                    help="bound of record_index's open-file cache, MB (0: no cache)")
    ap.add_argument("--index-layout", type=int, choices=INDEX_FILE_LAYOUTS, default=INDEX_FILE_LAYOUT,
                    help="index file layout written (format.md §6; default: what the product writes)")
    ap.add_argument("--max-buckets", type=int, default=None, help="build at most this many more buckets")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--build-only", action="store_true")
    g.add_argument("--no-build", action="store_true", help="measure the buckets already built")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    for name in ("buckets", "entries_per_bucket", "partitions", "files_per_partition", "runs", "pass_memory_mb"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    try:
        args.lookups = sorted({int(s) for s in args.lookups.split(",") if s.strip()})
        args.no_mmap_lookups = (args.lookups if args.no_mmap_lookups is None else
                                sorted({int(s) for s in args.no_mmap_lookups.split(",") if s.strip()}))
    except ValueError:
        ap.error("--lookups and --no-mmap-lookups are comma-separated integers")
    if args.cache_mb < 0:
        ap.error("--cache-mb must be 0 or more")
    if any(k <= 0 for k in args.lookups):
        ap.error("--lookups sizes must be positive")
    if args.buckets * args.entries_per_bucket >= MISS_OFFSET:
        ap.error("too many keys")

    t_start = time.perf_counter()
    workdir = os.path.abspath(args.workdir)
    check_manifest(workdir, args)
    index = Index(workdir, args)
    log(f"python {platform.python_version()}, pyarrow {pa.__version__}, numpy {np.__version__}, "
        f"{os.cpu_count()} cpus ({cpu_model()}), {mem_total_gb()} GB RAM; load {os.getloadavg()[0]:.2f}")
    build_info = {} if args.no_build else build(index, args)
    if args.build_only:
        return
    stats = index.stats()
    built = sorted(stats)
    if not built:
        sys.stderr.write(f"index_scale: no bucket of {workdir} is built yet; run without --no-build first\n")
        raise SystemExit(2)
    entries = sum(r["entries"] for r in stats.values())
    size = sum(r["bytes"] for r in stats.values())
    layouts = index.layouts(built)
    log(f"index: {len(built):,} of {index.buckets:,} buckets built (index file layout "
        f"{', '.join(map(str, layouts))}), {entries:,} entries, {size:,} bytes = {size / entries:.3f} bytes/entry")
    rng = np.random.default_rng(args.seed + 1)
    set_cache_limits(max_bytes=args.cache_mb << 20)
    load0 = os.getloadavg()
    rows, batches = measure_lookups(index, built, args, rng)
    nomap = measure_no_mmap(index, built, batches, args)
    largest = batches[(max(args.lookups), "hit")][0]
    grouping = engine_grouping_ms(largest, index.buckets)
    log(f"grouping {len(largest):,} keys by bucket: ArrowEngine._tag's filter per bucket "
        f"{grouping['filter_per_bucket_ms']:,.0f} ms, one sort {grouping['sort_ms']:,.0f} ms")
    open_ms = open_cost_ms(index, built)
    log(f"opening one bucket's index file (warm): {open_ms:.3f} ms")
    cache = cache_info()
    comp = measure_compaction(index, built[0], args, rng, os.path.join(workdir, "compaction_scratch"))
    load1 = os.getloadavg()
    by = {(r["keys"], r["kind"]): r for r in rows}

    def fig(k: int, kind: str, f: str):
        r = by.get((k, kind))
        return None if r is None else r[f]

    peak = max([r["peak_rss_cold_mb"] for r in rows] + [r["peak_rss_warm_mb"] for r in rows]
               + [r["peak_rss_mb"] for r in nomap])
    elapsed = time.perf_counter() - t_start
    out = {
        "benchmark": "index_scale",
        "buckets": index.buckets,
        "buckets_built": len(built),
        "entries": entries,
        "index_bytes": size,
        "bytes_per_entry": round(size / entries, 3),
        "lookup_1k_warm_ms": fig(1000, "hit", "warm_ms"),
        "lookup_100k_warm_ms": fig(100_000, "hit", "warm_ms"),
        "lookup_1m_warm_ms": fig(1_000_000, "hit", "warm_ms"),
        "lookup_100k_cold_ms": fig(100_000, "hit", "cold_ms"),
        "lookup_1m_cold_ms": fig(1_000_000, "hit", "cold_ms"),
        "peak_rss_mb": peak,
        "lookups": rows,
        "no_mmap": nomap,
        "grouping": grouping,
        "open_ms_per_bucket": open_ms,
        "cache_mb": args.cache_mb,
        "index_layout": args.index_layout,
        "index_layouts": layouts,
        "cache": cache,
        "compaction": comp,
        "build": build_info,
        "checked": all(r["checked"] for r in rows + nomap) and comp["checked"],
        "cold_eviction": args.cold,
        "entries_per_bucket": args.entries_per_bucket,
        "locations": len(index.locations),
        "seed": args.seed,
        "runs": args.runs,
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in load1],
        **machine(),
        "elapsed_s": round(elapsed, 1),
    }
    log(f"done in {elapsed:.0f} s")
    emit_result(out, args.json_out)


if __name__ == "__main__":
    main()
