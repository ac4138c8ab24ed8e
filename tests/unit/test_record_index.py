"""Record-index files: write, lookup (seek/scan/auto), newest-wins merging, file format details."""

from __future__ import annotations

import random
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from spark_jobs.index.hashing import fingerprints
from spark_jobs.index.record_index import (
    TOMBSTONE,
    IndexEntries,
    IndexFile,
    choose_mode,
    compact_entries,
    is_sealed_base,
    lookup,
    merge_entries,
    write_index_file,
)
from spark_jobs.io.filesystem import FileIO, resolve

pytestmark = pytest.mark.unit

MODES = ("seek", "scan", "auto")
LAYOUTS = (1, 2)
U64 = (1 << 64) - 1


READERS = ("summary", "summary_whole", "summary_mapped", "indexfile")


@pytest.fixture(params=READERS)
def fs(request, tmp_path, monkeypatch):
    """A local table directory, read one of the two ways a lookup reads local files: through
    resident summaries (``summary``: files count as settled at once, so even a file just written
    is summarised and cached; ``summary_whole``: each file read whole, as for many keys;
    ``summary_mapped``: the same through a mapping for the call, as a file above 64 MB) or opened as IndexFile each call (``indexfile``: caching off, the
    path files too young to vouch for, and every file without a memory map, take)."""
    from spark_jobs.index import record_index as ri
    from spark_jobs.io import filesystem

    ri.clear_cache()
    if request.param.startswith("summary"):
        monkeypatch.setattr(filesystem, "SETTLE_NS", 0)
        ri.set_cache_limits()
        if request.param in ("summary_whole", "summary_mapped"):  # every lookup reads its files whole
            monkeypatch.setattr(ri, "WHOLE_FILE_BYTES_PER_KEY", 1 << 40)
        if request.param == "summary_mapped":  # ... through a mapping for the call, as a file above 64 MB
            monkeypatch.setattr(ri, "WHOLE_FILE_MAX_BYTES", 0)
    else:
        ri.set_cache_limits(max_files=0)
    io, root = resolve(str(tmp_path))
    yield io, root
    ri.set_cache_limits()
    ri.clear_cache()


@pytest.fixture
def local(tmp_path):
    """A local table directory, as the product sees it (files younger than 2 s not cached)."""
    io, root = resolve(str(tmp_path))
    return io, root


@pytest.fixture(params=LAYOUTS, ids=lambda n: f"layout{n}")
def layout(request) -> int:
    """The index file layout a test writes (format.md §6): every release reads 1, the default;
    2 is read by this release and written only when asked."""
    return request.param


def _uuids(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]


def _write(io, path, mapping: dict[str, tuple[str, str] | None], **kw) -> str:
    keys = list(mapping)
    write_index_file(io, path, IndexEntries.from_keys(keys, [mapping[k] for k in keys]), **kw)
    return path


def _targets(res) -> list[tuple[str, str] | None]:
    return [res.target(i) for i in range(res.loc.size)]


def _oracle(*layers: dict[str, tuple[str, str] | None]) -> dict[str, tuple[str, str]]:
    merged: dict[str, tuple[str, str] | None] = {}
    for layer in layers:  # oldest first; later layers overwrite
        merged.update(layer)
    return {k: v for k, v in merged.items() if v is not None}


def _check_all_modes(io, paths, queries, expected: dict[str, tuple[str, str]]) -> None:
    from spark_jobs.index import record_index as ri
    from spark_jobs.io.filesystem import LocalFileIO

    want = [expected.get(k) for k in queries]
    results = {}
    for mode in MODES:
        before = ri.cache_info()
        res = lookup(io, paths, queries, mode=mode)
        after = ri.cache_info()
        opened = after["hits"] + after["misses"] - before["hits"] - before["misses"]
        summarised = isinstance(io, LocalFileIO) and mode != "scan" and after["max_files"] > 0
        assert opened == (len(paths) if summarised else 0), mode  # the path the fixture asked for
        if mode != "auto":
            assert res.mode == mode
        assert _targets(res) == want, mode
        assert res.found.tolist() == [w is not None for w in want], mode
        results[mode] = _targets(res)
    assert results["seek"] == results["scan"] == results["auto"]


# --------------------------------------------------------------------------------------
# round trip


def test_round_trip_every_mode_matches_dict_oracle(fs, layout) -> None:
    io, root = fs
    keys = _uuids(5000, seed=1)
    locs = [(f"dt=2024-01-{p:02d}", f"file-{f:03d}") for p in range(1, 11) for f in range(30)]
    rng = random.Random(2)
    mapping = {k: rng.choice(locs) for k in keys}
    p = _write(io, f"{root}/base.idx", mapping, block_rows=256, layout=layout)
    absent = _uuids(500, seed=3)
    queries = keys + absent
    random.Random(4).shuffle(queries)
    _check_all_modes(io, [p], queries, mapping)


def test_absent_keys_are_not_found(fs, layout) -> None:
    io, root = fs
    mapping = {f"key-{i}": ("p=0", f"f{i % 5}") for i in range(1000)}
    p = _write(io, f"{root}/base.idx", mapping, block_rows=64, layout=layout)
    absent = [f"key-{i}" for i in range(1000, 1300)] + ["", "KEY-1", "key-1 "]
    for mode in MODES:
        res = lookup(io, [p], absent, mode=mode)
        assert not res.found.any(), mode
        assert res.loc.tolist() == [-1] * len(absent)
        assert res.target(0) is None


def test_duplicate_query_keys_all_resolve(fs, layout) -> None:
    io, root = fs
    mapping = {f"key-{i}": ("p=0", f"f{i % 3}") for i in range(200)}
    p = _write(io, f"{root}/base.idx", mapping, block_rows=16, layout=layout)
    queries = ["key-5", "key-5", "nope", "key-7", "key-5", "nope"]
    _check_all_modes(io, [p], queries, mapping)


def test_index_file_metadata_and_entries(fs, layout) -> None:
    io, root = fs
    mapping = {f"key-{i}": (f"p={i % 4}", f"f{i % 9}") for i in range(100)}
    p = _write(io, f"{root}/base.idx", mapping, block_rows=30, metadata={"instant": "123"}, layout=layout)
    with IndexFile(io, p) as f:
        assert f.num_entries == 100
        assert f.num_blocks == 4  # 30 + 30 + 30 + 10
        assert f.metadata["instant"] == "123" and f.metadata["layout"] == layout
        assert sorted(f.locations) == sorted(set(mapping.values()))
        e = f.entries()
    order = np.lexsort((e.fp_lo, e.fp_hi))
    assert (order == np.arange(100)).all(), "file must be sorted by (fp_hi, fp_lo)"
    assert f.block_first_hi.tolist() == e.fp_hi[::30].tolist()
    hi, lo = fingerprints(list(mapping))
    got = {(h, l): t for h, l, t in zip(e.fp_hi.tolist(), e.fp_lo.tolist(), e.targets())}
    assert got == {(h, l): mapping[k] for k, h, l in zip(mapping, hi.tolist(), lo.tolist())}


# --------------------------------------------------------------------------------------
# base + deltas: newest wins


def test_newest_wins_across_base_and_three_deltas(fs, layout) -> None:
    io, root = fs
    rng = random.Random(11)
    keys = _uuids(3000, seed=12)
    locs = [(f"p={p}", f"f{f}") for p in range(5) for f in range(8)]
    base = {k: rng.choice(locs) for k in keys}
    layers = [base]
    pool = list(keys)
    for d in range(3):
        delta: dict[str, tuple[str, str] | None] = {}
        for k in rng.sample(pool, 300):  # updates (some to new files) and deletes of known keys
            delta[k] = None if rng.random() < 0.3 else (f"p={rng.randrange(5)}", f"g{d}-{rng.randrange(4)}")
        new = _uuids(100, seed=100 + d)  # inserts
        delta.update({k: (f"p={rng.randrange(5)}", f"g{d}-new") for k in new})
        pool += new
        layers.append(delta)
    paths = [_write(io, f"{root}/{i}.idx", layer, block_rows=128, layout=layout) for i, layer in enumerate(layers)]
    expected = _oracle(*layers)
    queries = pool + _uuids(200, seed=99)
    _check_all_modes(io, paths, queries, expected)
    # each prefix of the file list is a consistent older view
    for upto in range(1, 4):
        _check_all_modes(io, paths[:upto], rng.sample(queries, 500), _oracle(*layers[:upto]))
    merged = merge_entries(io, paths)
    hi, lo = fingerprints(list(expected))
    want = {(h, l): expected[k] for k, h, l in zip(expected, hi.tolist(), lo.tolist())}
    assert {(h, l): t for h, l, t in zip(merged.fp_hi.tolist(), merged.fp_lo.tolist(), merged.targets())} == want


def test_tombstone_hides_key(fs, layout) -> None:
    io, root = fs
    base = _write(io, f"{root}/base.idx", {"a": ("p=1", "f1"), "b": ("p=1", "f2")}, layout=layout)
    delta = _write(io, f"{root}/d1.idx", {"a": None}, layout=layout)
    _check_all_modes(io, [base, delta], ["a", "b"], {"b": ("p=1", "f2")})
    _check_all_modes(io, [base], ["a", "b"], {"a": ("p=1", "f1"), "b": ("p=1", "f2")})


def test_reinsert_after_delete_comes_back_at_new_location(fs, layout) -> None:
    io, root = fs
    filler = {f"other-{i}": ("p=0", "f0") for i in range(50)}
    d1 = _write(io, f"{root}/d1.idx", {"k": ("p=1", "old"), **filler}, block_rows=8, layout=layout)
    d2 = _write(io, f"{root}/d2.idx", {"k": None}, block_rows=8, layout=layout)
    d3 = _write(io, f"{root}/d3.idx", {"k": ("p=2", "new")}, block_rows=8, layout=layout)
    _check_all_modes(io, [d1], ["k"], {"k": ("p=1", "old")})
    _check_all_modes(io, [d1, d2], ["k"], {})
    _check_all_modes(io, [d1, d2, d3], ["k", "other-3"], {"k": ("p=2", "new"), "other-3": ("p=0", "f0")})
    merged = merge_entries(io, [d1, d2, d3])
    assert len(merged) == 51
    assert ("p=2", "new") in merged.targets() and ("p=1", "old") not in merged.targets()


def test_key_moved_to_another_partition_resolves_to_newest_location(fs, layout) -> None:
    io, root = fs
    base = _write(io, f"{root}/base.idx", {"k": ("country=FR", "f1"), "j": ("country=FR", "f1")}, layout=layout)
    d1 = _write(io, f"{root}/d1.idx", {"k": ("country=DE", "f7")}, layout=layout)
    d2 = _write(io, f"{root}/d2.idx", {"j": ("country=IT", "f9")}, layout=layout)
    _check_all_modes(
        io, [base, d1, d2], ["k", "j"], {"k": ("country=DE", "f7"), "j": ("country=IT", "f9")}
    )
    res = lookup(io, [base, d1, d2], ["k", "j", "k"])
    assert sorted(res.locations) == [("country=DE", "f7"), ("country=IT", "f9")]  # only used ones


def test_delta_with_only_tombstones(fs, layout) -> None:
    io, root = fs
    base = _write(io, f"{root}/base.idx", {f"k{i}": ("p", "f") for i in range(20)}, layout=layout)
    delta = _write(io, f"{root}/d.idx", {f"k{i}": None for i in range(0, 20, 2)}, layout=layout)
    with IndexFile(io, delta) as f:
        assert f.locations == []
        assert (f.entries().loc == TOMBSTONE).all()
    _check_all_modes(io, [base, delta], [f"k{i}" for i in range(20)], {f"k{i}": ("p", "f") for i in range(1, 20, 2)})


def test_merge_entries_matches_oracle_and_keeps_tombstones_on_request(fs, layout) -> None:
    io, root = fs
    l0 = {f"k{i}": ("p=0", f"f{i % 3}") for i in range(100)}
    l1 = {**{f"k{i}": None for i in range(0, 100, 10)}, "n1": ("p=1", "f")}
    l2 = {"k0": ("p=2", "back"), "k5": None, "n1": None, "n2": ("p=2", "g")}
    paths = [_write(io, f"{root}/{i}.idx", l, block_rows=7, layout=layout) for i, l in enumerate((l0, l1, l2))]
    expected = _oracle(l0, l1, l2)

    def as_dict(e: IndexEntries) -> dict[tuple[int, int], tuple[str, str] | None]:
        return {(h, l): t for h, l, t in zip(e.fp_hi.tolist(), e.fp_lo.tolist(), e.targets())}

    def fp(k: str) -> tuple[int, int]:
        hi, lo = fingerprints([k])
        return int(hi[0]), int(lo[0])

    merged = merge_entries(io, paths)
    assert as_dict(merged) == {fp(k): v for k, v in expected.items()}
    assert TOMBSTONE not in merged.loc.tolist()
    with_tombs = merge_entries(io, paths, keep_tombstones=True)
    final = {**l0, **l1, **l2}
    assert as_dict(with_tombs) == {fp(k): v for k, v in final.items()}
    assert sum(t is None for t in with_tombs.targets()) == sum(v is None for v in final.values())
    # the merged result can be written back as a new base and looked up
    base = f"{root}/compacted.idx"
    write_index_file(io, base, with_tombs, layout=layout)
    _check_all_modes(io, [base], list(final) + ["zzz"], expected)


def test_merge_entries_of_nothing() -> None:
    e = merge_entries(FileIO(pafs.LocalFileSystem()), [])
    assert len(e) == 0 and e.locations == []


# --------------------------------------------------------------------------------------
# block boundaries and fingerprint edge cases


def test_block_boundaries(fs, layout) -> None:
    io, root = fs
    mapping = {f"key-{i}": (f"p={i % 3}", f"f{i % 11}") for i in range(50)}
    p = _write(io, f"{root}/base.idx", mapping, block_rows=7, layout=layout)
    with IndexFile(io, p) as f:
        assert f.num_blocks == 8  # ceil(50 / 7)
        e = f.entries()
    by_fp = {}
    hi, lo = fingerprints(list(mapping))
    for k, h, l in zip(mapping, hi.tolist(), lo.tolist()):
        by_fp[(h, l)] = k
    sorted_keys = [by_fp[(h, l)] for h, l in zip(e.fp_hi.tolist(), e.fp_lo.tolist())]
    edges = sorted({i for b in range(0, 50, 7) for i in (b, b + 6) if i < 50} | {49})
    for idx_set in ([i] for i in edges):  # each edge key alone
        _check_all_modes(io, [p], [sorted_keys[i] for i in idx_set], mapping)
    _check_all_modes(io, [p], [sorted_keys[i] for i in edges], mapping)
    _check_all_modes(io, [p], sorted_keys, mapping)

    first_hi, first_lo = int(e.fp_hi[0]), int(e.fp_lo[0])
    last_hi, last_lo = int(e.fp_hi[-1]), int(e.fp_lo[-1])
    needles = [
        (0, 0),  # below every key
        (U64, U64),  # above every key
        (first_hi, first_lo ^ 1) if first_lo else (first_hi, 1),  # first block key's hi, wrong lo
        (last_hi, last_lo ^ 1),
        (int(e.fp_hi[7]) - 1, 0),  # just below the second block's first key
        (int(e.fp_hi[6]) + 1, 0) if int(e.fp_hi[6]) + 1 != int(e.fp_hi[7]) else (0, 1),
        (int(e.fp_hi[7]), int(e.fp_lo[7])),  # present: second block's first key
        (int(e.fp_hi[6]), int(e.fp_lo[6])),  # present: first block's last key
    ]
    nh = np.array([n[0] for n in needles], dtype=np.uint64)
    nl = np.array([n[1] for n in needles], dtype=np.uint64)
    for mode in ("seek", "scan", "auto"):
        res = lookup(io, [p], fp=(nh, nl), mode=mode)
        assert res.found.tolist() == [False] * 6 + [True, True], mode
        assert res.target(6) == mapping[sorted_keys[7]]
        assert res.target(7) == mapping[sorted_keys[6]]


def _fp_file(io, path, fps: list[tuple[int, int]], block_rows: int, **kw) -> list[tuple[str, str]]:
    targets = [(f"p={i % 2}", f"f{i}") for i in range(len(fps))]
    hi = np.array([h for h, _ in fps], dtype=np.uint64)
    lo = np.array([l for _, l in fps], dtype=np.uint64)
    write_index_file(io, path, IndexEntries.from_fingerprints(hi, lo, targets), block_rows=block_rows, **kw)
    return targets


@pytest.mark.parametrize("block_rows", [2, 3, 4, 7, 1000])
def test_entries_sharing_fp_hi(fs, layout, block_rows: int) -> None:
    """Several entries with the same fp_hi (different fp_lo), including runs across blocks."""
    io, root = fs
    fps = [(5, 9), (5, 1), (5, 7), (5, 3), (5, 2), (9, 4), (9, 0), (1, 1), (20, 5), (U64, 1), (U64, 0), (0, 8)]
    path = f"{root}/coll.idx"
    targets = _fp_file(io, path, fps, block_rows, layout=layout)
    expected = dict(zip(fps, targets))
    # look every entry up (in a shuffled order with repeats), plus absent needles sharing hi
    absent = [(5, 4), (5, 100), (9, 1), (1, 0), (U64, 2), (0, 0), (3, 3)]
    needles = fps + fps[:4] + absent
    random.Random(block_rows).shuffle(needles)
    nh = np.array([n[0] for n in needles], dtype=np.uint64)
    nl = np.array([n[1] for n in needles], dtype=np.uint64)
    for mode in MODES:
        res = lookup(io, [path], fp=(nh, nl), mode=mode)
        assert _targets(res) == [expected.get(n) for n in needles], mode
    # one needle at a time (scan's hash join then sees a single needle per fp_hi)
    for n in fps + absent:
        for mode in ("seek", "scan"):
            res = lookup(
                io, [path], fp=(np.array([n[0]], np.uint64), np.array([n[1]], np.uint64)), mode=mode
            )
            assert res.target(0) == expected.get(n), (n, mode)


def test_fp_hi_collisions_across_base_and_delta(fs, layout) -> None:
    io, root = fs
    base = f"{root}/base.idx"
    _fp_file(io, base, [(5, 1), (5, 2), (5, 3), (5, 4)], block_rows=2, layout=layout)
    delta = f"{root}/delta.idx"
    hi = np.array([5, 5], dtype=np.uint64)
    lo = np.array([2, 6], dtype=np.uint64)
    write_index_file(io, delta, IndexEntries.from_fingerprints(hi, lo, [None, ("p=9", "new")]), block_rows=1,
                     layout=layout)
    nh = np.array([5, 5, 5, 5, 5, 5], dtype=np.uint64)
    nl = np.array([1, 2, 3, 4, 6, 7], dtype=np.uint64)
    for mode in MODES:
        res = lookup(io, [base, delta], fp=(nh, nl), mode=mode)
        assert _targets(res) == [("p=0", "f0"), None, ("p=0", "f2"), ("p=1", "f3"), ("p=9", "new"), None]


def test_duplicate_fingerprints_rejected(fs) -> None:
    io, root = fs
    with pytest.raises(ValueError, match="unique"):
        write_index_file(io, f"{root}/dup.idx", IndexEntries.from_keys(["a", "b", "a"], [("p", "1")] * 3))
    hi = np.array([3, 3, 3], dtype=np.uint64)
    lo = np.array([1, 2, 1], dtype=np.uint64)
    with pytest.raises(ValueError):
        write_index_file(io, f"{root}/dup2.idx", IndexEntries.from_fingerprints(hi, lo, [("p", "1"), None, None]))
    # same fp_hi with different fp_lo is fine
    write_index_file(io, f"{root}/ok.idx", IndexEntries.from_fingerprints(hi[:2], lo[:2], [("p", "1"), None]))


@pytest.mark.parametrize(
    ("num_locations", "expected_type"),
    [(1, pa.int8()), (127, pa.int8()), (128, pa.int16()), (2**15 - 1, pa.int16()), (2**15, pa.int32())],
)
def test_loc_column_is_narrowed(fs, num_locations: int, expected_type: pa.DataType) -> None:
    io, root = fs
    n = max(num_locations, 10)
    keys = [f"key-{i}" for i in range(n)]
    targets = [(f"p={i % num_locations % 7}", f"f{i % num_locations}") for i in range(n)]
    path = f"{root}/narrow.idx"
    write_index_file(io, path, IndexEntries.from_keys(keys, targets), block_rows=4096)
    with IndexFile(io, path) as f:
        assert f.read_all().schema.field("loc").type == expected_type
        assert len(f.locations) == num_locations
    sample = keys[:: max(1, n // 500)]
    _check_all_modes(io, [path], sample, dict(zip(keys, targets)))


def test_loc_counts_only_used_locations(fs, layout) -> None:
    io, root = fs
    hi, lo = fingerprints([f"k{i}" for i in range(10)])
    many = [(f"p={i}", "f") for i in range(300)]
    e = IndexEntries(hi, lo, np.array([0, 299, 0, 150, -1, 299, 0, 0, 150, 1], dtype=np.int32), many)
    path = f"{root}/used.idx"
    write_index_file(io, path, e, layout=layout)
    with IndexFile(io, path) as f:
        assert f.read_all().schema.field("loc").type == pa.int8()
        assert sorted(f.locations) == sorted({many[i] for i in (0, 299, 150, 1)})
        assert f.entries().targets().count(None) == 1
    res = lookup(io, [path], fp=(hi, lo))
    assert _targets(res) == e.targets()


# --------------------------------------------------------------------------------------
# empty inputs


def test_empty_file_and_empty_batch(fs, layout) -> None:
    io, root = fs
    empty = f"{root}/empty.idx"
    size = write_index_file(io, empty, IndexEntries.from_keys([], []), layout=layout)
    assert size > 0
    with IndexFile(io, empty) as f:
        assert f.num_entries == 0
        assert len(f.entries()) == 0
    for mode in MODES:
        res = lookup(io, [empty], ["a", "b"], mode=mode)
        assert res.loc.tolist() == [-1, -1]
    full = _write(io, f"{root}/full.idx", {"a": ("p", "f")}, layout=layout)
    for mode in MODES:
        assert lookup(io, [full], [], mode=mode).loc.size == 0
        assert lookup(io, [full, empty], ["a"], mode=mode).target(0) == ("p", "f")
        assert lookup(io, [empty, full], ["a"], mode=mode).target(0) == ("p", "f")
        assert lookup(io, [], ["a"], mode=mode).loc.tolist() == [-1]
    assert len(merge_entries(io, [empty])) == 0
    assert len(merge_entries(io, [empty, full])) == 1


# --------------------------------------------------------------------------------------
# mode selection


def test_mode_override_and_validation(fs) -> None:
    io, root = fs
    p = _write(io, f"{root}/b.idx", {f"k{i}": ("p", "f") for i in range(100)}, block_rows=10)
    for mode in ("seek", "scan"):
        assert lookup(io, [p], [f"k{i}" for i in range(100)], mode=mode).mode == mode
        assert lookup(io, [p], ["k1"], mode=mode).mode == mode
    with pytest.raises(ValueError, match="lookup mode"):
        lookup(io, [p], ["k1"], mode="hash")
    with pytest.raises(ValueError):
        choose_mode("fast")
    assert choose_mode("scan", memory_mapped=True) == "scan"
    assert choose_mode("seek", memory_mapped=False, touched_fraction=1.0) == "seek"


def test_auto_seeks_on_memory_mapped_files(fs) -> None:
    io, root = fs
    keys = [f"k{i}" for i in range(2000)]
    p = _write(io, f"{root}/b.idx", {k: ("p", "f") for k in keys}, block_rows=100)
    with IndexFile(io, p) as f:
        assert f.memory_mapped
    for batch in (keys[:1], keys[:500], keys, keys + [f"x{i}" for i in range(5000)]):
        assert lookup(io, [p], batch).mode == "seek"


def test_auto_on_storage_without_memory_map_scans_when_most_blocks_are_touched(fs, layout) -> None:
    io, root = fs
    nio = FileIO(pafs.LocalFileSystem())  # the generic layer: no memory map (as for HDFS, S3)
    keys = [f"k{i}" for i in range(2000)]
    mapping = {k: (f"p={i % 3}", "f") for i, k in enumerate(keys)}
    p = _write(io, f"{root}/b.idx", mapping, block_rows=100, layout=layout)
    with IndexFile(nio, p) as f:
        assert not f.memory_mapped
    one = lookup(nio, [p], keys[:1])
    assert one.mode == "seek" and one.target(0) == mapping[keys[0]]
    many = lookup(nio, [p], keys)
    assert many.mode == "scan"
    assert _targets(many) == [mapping[k] for k in keys]
    _check_all_modes(nio, [p], keys[:300] + ["absent"], mapping)
    assert choose_mode(memory_mapped=False, touched_fraction=0.0) == "seek"
    assert choose_mode(memory_mapped=False, touched_fraction=1.0) == "scan"
    assert choose_mode(memory_mapped=True, touched_fraction=1.0) == "seek"


def test_compact_entries_keeps_only_tombstones_that_hide_a_sealed_entry(fs, layout) -> None:
    """Sealed bases are never rewritten: a tombstone of a key they still hold must survive the
    compaction of the open part, or the deleted key would come back; other tombstones go."""
    io, root = fs
    a, b = ("p=a", "f1"), ("p=b", "f2")
    sealed1 = _write(io, f"{root}/base_1_x_sealed.arrow", {"gone": a, "moved": a, "kept": a, "twice": a},
                     metadata={"sealed": True}, layout=layout)
    # a later sealed base already deleted "twice": its newest sealed entry is a tombstone
    sealed2 = _write(io, f"{root}/base_2_x_sealed.arrow", {"twice": None, "other": b}, metadata={"sealed": True},
                     layout=layout)
    base = _write(io, f"{root}/base_3_x.arrow", {"open-gone": b, "back": b}, layout=layout)
    delta = _write(io, f"{root}/delta_4.arrow", {"gone": None, "moved": b, "open-gone": None, "twice": None,
                                                "back": None, "never": None}, layout=layout)
    delta2 = _write(io, f"{root}/delta_5.arrow", {"back": a}, layout=layout)
    sealed = [sealed1, sealed2]
    out = compact_entries(io, [base, delta, delta2], sealed=sealed)
    got = dict(zip(zip(out.fp_hi.tolist(), out.fp_lo.tolist()), out.targets()))
    fp = lambda k: tuple(int(x[0]) for x in fingerprints([k]))  # noqa: E731
    assert got == {fp("gone"): None, fp("moved"): b, fp("back"): a}
    # without sealed bases below, every tombstone is dropped (the old rule)
    assert (compact_entries(io, [base, delta, delta2]).loc != TOMBSTONE).all()
    # the bucket read through sealed bases + the new base equals the bucket read through all files
    new = f"{root}/base_6_y.arrow"
    write_index_file(io, new, out, layout=layout)
    keys = ["gone", "moved", "kept", "twice", "other", "open-gone", "back", "never"]
    assert _targets(lookup(io, [*sealed, new], keys)) == _targets(lookup(io, [*sealed, base, delta, delta2], keys))
    assert _targets(lookup(io, [*sealed, new], keys)) == [None, b, a, None, b, None, a, None]


def test_sealed_base_is_told_by_name_and_metadata(fs, layout) -> None:
    io, root = fs
    assert is_sealed_base("index/bucket=00003/base_20240101000000000_ab12cd34_sealed.arrow")
    assert not is_sealed_base("index/bucket=00003/base_20240101000000000_ab12cd34.arrow")
    assert not is_sealed_base("index/bucket=00003/delta_20240101000000000.arrow")
    path = _write(io, f"{root}/base_1_x_sealed.arrow", {"k": ("p", "f")}, metadata={"sealed": True}, layout=layout)
    with IndexFile(io, path) as f:
        assert f.sealed and f.num_entries == 1
    with IndexFile(io, _write(io, f"{root}/base_2_x.arrow", {"k": ("p", "f")}, layout=layout)) as f:
        assert not f.sealed


# --------------------------------------------------------------------------------------
# index file layouts: 1 (every release reads it) is written by default; 2 stores the location
# table once (footer), is read, and is written only when asked


def _write_layout_1(path: str, entries: IndexEntries, *, block_rows: int = 65_536) -> None:
    """An index file as releases before layout 2 wrote it: location table and block index in
    the schema metadata (which Arrow IPC stores twice), no ``layout`` in bucketindex.meta."""
    import json

    import pyarrow.ipc as ipc

    order = np.lexsort((entries.fp_lo, entries.fp_hi))
    hi, lo, loc = entries.fp_hi[order], entries.fp_lo[order], entries.loc[order].astype(np.int16)
    schema = pa.schema(
        [("fp_hi", pa.uint64()), ("fp_lo", pa.uint64()), ("loc", pa.int16())],
        metadata={
            b"bucketindex.locations": json.dumps(entries.locations, separators=(",", ":")).encode(),
            b"bucketindex.block_first_hi": json.dumps([str(v) for v in hi[::block_rows].tolist()]).encode(),
            b"bucketindex.meta": json.dumps({"entries": int(hi.size)}).encode(),
        },
    )
    with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, schema) as w:
        for s in range(0, max(hi.size, 1), block_rows):
            sl = slice(s, s + block_rows)
            w.write_batch(pa.record_batch([pa.array(hi[sl]), pa.array(lo[sl]), pa.array(loc[sl])], schema=schema))


def test_layout_2_stores_the_location_table_once_in_the_footer(fs) -> None:
    import json

    import pyarrow.ipc as ipc

    io, root = fs
    mapping = {f"key-{i}": (f"p={i % 3}", f"file-{i % 5}-{'x' * 30}") for i in range(300)}
    p = _write(io, f"{root}/base.arrow", mapping, block_rows=64, layout=2)
    raw = open(p, "rb").read()
    for loc in set(mapping.values()):  # each location once in the file: the table is stored once
        assert raw.count(json.dumps(list(loc), separators=(",", ":")).encode()) == 1
    with ipc.open_file(pa.memory_map(p)) as r:
        schema_md, footer_md = r.schema.metadata, r.metadata
    assert json.loads(schema_md[b"bucketindex.meta"])["layout"] == 2
    assert b"bucketindex.block_first_hi" not in schema_md
    with pytest.raises(ValueError):  # what a layout-1 reader does with it: fails, does not read []
        json.loads(schema_md[b"bucketindex.locations"])
    assert sorted(map(tuple, json.loads(footer_md[b"bucketindex.locations"]))) == sorted(set(mapping.values()))
    assert len(json.loads(footer_md[b"bucketindex.block_first_hi"])) == 5  # 300 entries, blocks of 64


def test_layout_1_files_still_read_and_answer_like_layout_2(fs) -> None:
    from spark_jobs.index.record_index import index_file_problem

    io, root = fs
    keys = _uuids(500, seed=11)
    mapping = {k: (None if i % 7 == 0 else (f"p={i % 4}", f"f{i % 13}")) for i, k in enumerate(keys)}
    entries = IndexEntries.from_keys(keys, [mapping[k] for k in keys])
    old = f"{root}/old.arrow"
    _write_layout_1(old, entries, block_rows=50)
    new = _write(io, f"{root}/new.arrow", mapping, block_rows=50, layout=2)
    assert open(old, "rb").read().count(b'["p=0","f12"]') == 2  # the old layout: stored twice
    assert index_file_problem(io, old) is None
    with IndexFile(io, old) as f, IndexFile(io, new) as g:
        assert f.metadata.get("layout") is None and g.metadata["layout"] == 2
        assert f.block_first_hi.tolist() == g.block_first_hi.tolist() and f.num_blocks == g.num_blocks == 10
        assert sorted(f.locations) == sorted(g.locations)
    queries = keys[::3] + ["absent-1", "absent-2"]
    live = {k: v for k, v in mapping.items() if v is not None}
    _check_all_modes(io, [old], queries, live)
    _check_all_modes(io, [new], queries, live)
    # a bucket holding both layouts: newest wins across them
    delta = _write(io, f"{root}/delta.arrow", {keys[1]: None, keys[0]: ("p=9", "back")}, layout=2)
    want = {k: live[k] for k in keys[2:3] if k in live} | {keys[0]: ("p=9", "back")}  # keys[1] deleted
    _check_all_modes(io, [old, delta], keys[:3], want)
    got = merge_entries(io, [old, delta])
    assert len(got) == len(live) - (keys[1] in live) + (keys[0] not in live)


def test_a_default_write_is_layout_1_as_every_release_reads_it(fs) -> None:
    """Releases before layout 2 refuse a layout-2 file as damaged, so a writer of a mixed-version
    deployment must write layout 1 unless asked: the tables in the schema metadata, as JSON
    (what those releases parse), nothing in the footer, ``"layout": 1`` (a member they ignore)."""
    import json

    import pyarrow.ipc as ipc

    from spark_jobs.index.record_index import INDEX_FILE_LAYOUT

    io, root = fs
    assert INDEX_FILE_LAYOUT == 1
    keys = _uuids(300, seed=21)
    mapping = {k: (f"p={i % 3}", f"file-{i % 5}") for i, k in enumerate(keys)}
    p = _write(io, f"{root}/base.arrow", mapping, block_rows=64, metadata={"instant": "7"})
    with ipc.open_file(pa.memory_map(p)) as r:
        schema_md, footer_md = r.schema.metadata, r.metadata
    assert json.loads(schema_md[b"bucketindex.meta"]) == {"instant": "7", "entries": 300, "layout": 1}
    assert sorted(map(tuple, json.loads(schema_md[b"bucketindex.locations"]))) == sorted(set(mapping.values()))
    assert len(json.loads(schema_md[b"bucketindex.block_first_hi"])) == 5  # 300 entries, blocks of 64
    assert not footer_md  # nothing a layout-1 reader would miss
    assert open(p, "rb").read().count(b'["p=0","file-0"]') == 2  # Arrow IPC's two schema copies
    # the same tables as a layout-1 file written by hand as releases before wrote it
    old = f"{root}/old.arrow"
    _write_layout_1(old, IndexEntries.from_keys(keys, [mapping[k] for k in keys]), block_rows=64)
    with IndexFile(io, p) as f, IndexFile(io, old) as g:
        assert f.metadata["layout"] == 1 and g.metadata.get("layout") is None
        assert f.block_first_hi.tolist() == g.block_first_hi.tolist()
        assert sorted(f.locations) == sorted(g.locations)
    _check_all_modes(io, [p], keys[::4] + ["absent"], mapping)
    _check_all_modes(io, [old], keys[::4] + ["absent"], mapping)


def test_writing_an_unknown_layout_is_refused(fs) -> None:
    import os

    io, root = fs
    for bad in (0, 3):
        with pytest.raises(ValueError, match=f"layout {bad}"):
            _write(io, f"{root}/x{bad}.arrow", {"a": ("p", "f")}, layout=bad)
    assert os.listdir(root) == []  # refused before writing anything


def test_an_unknown_layout_is_refused_naming_the_file(fs) -> None:
    import json

    import pyarrow.ipc as ipc

    from spark_jobs.exceptions import IndexCorruptError

    io, root = fs
    p = f"{root}/future.arrow"
    schema = pa.schema([("fp_hi", pa.uint64()), ("fp_lo", pa.uint64()), ("loc", pa.int8())],
                       metadata={b"bucketindex.meta": json.dumps({"entries": 0, "layout": 3}).encode()})
    with pa.OSFile(p, "wb") as sink, ipc.new_file(sink, schema) as w:
        w.write_batch(pa.record_batch([pa.array([], pa.uint64()), pa.array([], pa.uint64()),
                                       pa.array([], pa.int8())], schema=schema))
    with pytest.raises(IndexCorruptError, match="layout 3") as e:
        lookup(io, [p], ["k"])
    assert p in str(e.value)


# --------------------------------------------------------------------------------------
# the open-file cache: repeated lookups reuse open files, never a stale one


@pytest.fixture
def cache():
    from spark_jobs.index import record_index as ri

    ri.clear_cache()
    ri.set_cache_limits()
    yield ri
    ri.set_cache_limits()
    ri.clear_cache()


def _age(path: str, seconds: float = 60.0, *, mtime_ns: int | None = None) -> int:
    """Set ``path``'s mtime ``seconds`` into the past (files younger than 2 s are not cached)."""
    import os
    import time

    ns = mtime_ns if mtime_ns is not None else time.time_ns() - int(seconds * 1e9)
    os.utime(path, ns=(ns, ns))
    return ns


def test_repeated_lookups_are_served_from_the_cache(local, layout, cache) -> None:
    io, root = local
    mapping = {f"k{i}": (f"p={i % 3}", f"f{i % 4}") for i in range(400)}
    base = _write(io, f"{root}/base.arrow", mapping, block_rows=32, layout=layout)
    _age(base)
    first = lookup(io, [base], list(mapping) + ["nope"])
    assert cache.cache_info()["files"] == 1 and cache.cache_info()["misses"] == 1
    again = lookup(io, [base], list(mapping) + ["nope"])
    assert cache.cache_info()["hits"] == 1
    assert _targets(again) == _targets(first) == [mapping[k] for k in mapping] + [None]
    _check_all_modes(io, [base], list(mapping)[::7] + ["x"], mapping)


def test_a_file_younger_than_two_seconds_is_not_cached(local, layout, cache) -> None:
    io, root = local
    p = _write(io, f"{root}/fresh.arrow", {"a": ("p", "f")}, layout=layout)
    assert lookup(io, [p], ["a"]).target(0) == ("p", "f")
    assert cache.cache_info()["files"] == 0


def _same_size_mappings() -> tuple[dict, dict]:
    keys = [f"k{i}" for i in range(200)]
    a = {k: ("p=0", "aaaa") for k in keys}
    b = {k: ("p=0", "bbbb") for k in keys[:150]}
    b.update({f"n{i}": ("p=0", "bbbb") for i in range(50)})  # 50 keys gone, 50 new: same entry count
    return a, b


def test_a_file_rewritten_in_place_is_not_served_from_the_cache(local, layout, cache) -> None:
    io, root = local
    a, b = _same_size_mappings()
    p = _write(io, f"{root}/bucket.arrow", a, layout=layout)
    _age(p)
    size = io.size(p)
    assert lookup(io, [p], ["k0", "k199", "n0"]).found.tolist() == [True, True, False]
    assert cache.cache_info()["files"] == 1
    with open(p, "r+b") as f:  # the same inode, the same size: only the mtime tells
        f.write(open(_write(io, f"{root}/b.arrow", b, layout=layout), "rb").read())
    assert io.size(p) == size
    res = lookup(io, [p], ["k0", "k199", "n0"])
    assert _targets(res) == [("p=0", "bbbb"), None, ("p=0", "bbbb")]
    _age(p, 30)  # settled again, at another mtime than the cached entry's: opened anew, then cached
    misses = cache.cache_info()["misses"]
    assert _targets(lookup(io, [p], ["k0", "k199", "n0"])) == [("p=0", "bbbb"), None, ("p=0", "bbbb")]
    assert cache.cache_info()["misses"] == misses + 1 and cache.cache_info()["files"] == 1


def test_a_file_replaced_with_the_same_size_and_mtime_is_not_served_from_the_cache(local, layout, cache) -> None:
    import os

    io, root = local
    a, b = _same_size_mappings()
    p = _write(io, f"{root}/bucket.arrow", a, layout=layout)
    ns = _age(p)
    assert lookup(io, [p], ["k0", "n0"]).found.tolist() == [True, False]
    other = _write(io, f"{root}/b.tmp", b, layout=layout)
    _age(other, mtime_ns=ns)  # the same size and mtime: only the inode tells
    os.replace(other, p)
    assert _targets(lookup(io, [p], ["k0", "k199", "n0"])) == [("p=0", "bbbb"), None, ("p=0", "bbbb")]


def test_a_compacted_bucket_reads_its_new_base_and_a_deleted_file_is_missing(local, layout, cache) -> None:
    import os

    from spark_jobs.exceptions import IndexCorruptError

    io, root = local
    base = _write(io, f"{root}/base.arrow", {f"k{i}": ("p", "old") for i in range(100)}, layout=layout)
    delta = _write(io, f"{root}/delta.arrow", {"k1": None, "k2": ("p", "new"), "k200": ("p", "new")}, layout=layout)
    for p in (base, delta):
        _age(p)
    queries = ["k0", "k1", "k2", "k200"]
    want = [("p", "old"), None, ("p", "new"), ("p", "new")]
    assert _targets(lookup(io, [base, delta], queries)) == want
    new_base = f"{root}/base_2.arrow"
    write_index_file(io, new_base, compact_entries(io, [base, delta]), layout=layout)
    _age(new_base)
    assert _targets(lookup(io, [new_base], queries)) == want
    os.remove(base)  # a clean removed the folded file: still cached, but gone
    with pytest.raises(IndexCorruptError, match="missing"):
        lookup(io, [base, delta], queries)
    assert _targets(lookup(io, [new_base], queries)) == want


def _mapped(path: str) -> bool:
    """Whether this process maps ``path`` (a line of /proc/self/maps names it)."""
    import os

    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        return any(line.rstrip("\n").endswith(" " + real) for line in f)


def test_the_cache_is_bounded_and_holds_no_file_descriptors_or_mappings(local, layout, cache) -> None:
    import os

    io, root = local
    paths = []
    for i in range(6):
        p = _write(io, f"{root}/b{i}.arrow", {f"k{i}-{j}": ("p", f"f{j % 3}") for j in range(100)}, layout=layout)
        _age(p)
        paths.append(p)
    fds = len(os.listdir("/proc/self/fd"))
    for p in paths:
        assert lookup(io, [p], ["x", f"k{paths.index(p)}-4"]).target(1) == ("p", "f1")
    assert cache.cache_info()["files"] == 6
    assert len(os.listdir("/proc/self/fd")) == fds  # the descriptor a lookup reads through is closed
    assert not any(_mapped(p) for p in paths)  # and nothing of the file stays mapped (RSS: the summary only)
    one = cache.cache_info()["bytes"] // 6  # six files of the same shape: six summaries of one size
    assert cache.cache_info()["bytes"] == 6 * one and 0 < one < io.size(paths[0]) + 4096
    cache.set_cache_limits(max_files=4)
    assert cache.cache_info()["files"] == 4
    for p in paths:
        lookup(io, [p], ["x"])
    assert cache.cache_info()["files"] == 4
    cache.set_cache_limits(max_bytes=2 * one)
    assert cache.cache_info()["files"] == 2 and cache.cache_info()["bytes"] == 2 * one
    cache.set_cache_limits(max_files=0)
    assert cache.cache_info()["files"] == 0
    assert lookup(io, [paths[3]], ["k3-5"]).target(0) == ("p", "f2")
    assert cache.cache_info()["files"] == 0  # off: nothing kept
    assert len(os.listdir("/proc/self/fd")) == fds and not any(_mapped(p) for p in paths)


def test_a_dense_lookup_of_a_large_file_maps_it_for_the_call_only(local, layout, cache, monkeypatch) -> None:
    """Many keys in a file above WHOLE_FILE_MAX_BYTES (a bucket of millions of entries): searched
    in a mapping made for the call -- no read per key, no copy -- exactly, and nothing stays
    mapped or open when the call returns."""
    import os

    from spark_jobs.index import record_index as ri

    io, root = local
    want = {f"k {j}/%é+": ("p=1", f"f{j % 7}") for j in range(5000)}
    p = _write(io, f"{root}/big.arrow", want, block_rows=512, layout=layout)
    _age(p)
    assert lookup(io, [p], ["absent"]).target(0) is None  # the summary, built and cached
    monkeypatch.setattr(ri, "WHOLE_FILE_MAX_BYTES", 1024)  # the file counts as large
    reads: list[int] = []
    real = ri._pread
    monkeypatch.setattr(ri, "_pread", lambda fd, offs, size: reads.append(len(offs)) or real(fd, offs, size))
    monkeypatch.setattr(ri, "_file_bytes", lambda *a: pytest.fail("a large file was copied whole"))
    fds = len(os.listdir("/proc/self/fd"))
    qs = list(want)[::3] + ["absent", "k 1/%e+"]
    assert _targets(lookup(io, [p], qs)) == [want.get(q) for q in qs]
    assert not reads  # searched in the mapping, not through a read per key
    assert len(os.listdir("/proc/self/fd")) == fds and not _mapped(p)
    # few keys for its size: windows read per key, as before
    assert _targets(lookup(io, [p], ["k 7/%é+"])) == [want["k 7/%é+"]] and reads


def test_lookups_on_threads_survive_evictions(local, layout, cache) -> None:
    from concurrent.futures import ThreadPoolExecutor

    io, root = local
    maps, paths = [], []
    for i in range(8):
        m = {f"k{i}-{j}": (f"p={i}", f"f{j % 5}") for j in range(300)}
        p = _write(io, f"{root}/b{i}.arrow", m, block_rows=16, layout=layout)
        _age(p)
        maps.append(m)
        paths.append(p)
    cache.set_cache_limits(max_files=3)  # every round evicts files other threads are searching

    def one(n: int) -> bool:
        i = n % 8
        qs = list(maps[i])[n % 7::5] + ["absent"]
        return _targets(lookup(io, [paths[i]], qs)) == [maps[i].get(q) for q in qs]

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(pool.map(one, range(200)))


def test_a_generic_fileio_is_never_cached(local, layout, cache) -> None:
    io, root = local
    p = _write(io, f"{root}/base.arrow", {"a": ("p", "f")}, layout=layout)
    _age(p)
    generic = FileIO(pafs.LocalFileSystem())
    assert generic.identity(p) is None
    assert lookup(generic, [p], ["a"]).target(0) == ("p", "f")
    assert cache.cache_info()["files"] == 0


# --------------------------------------------------------------------------------------
# resident summaries: the sample's windows, uneven files, eviction, what a summary is counted at


def _sorted_fps(n: int, seed: int, *, skewed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``n`` distinct sorted fp_hi (uniform as hashes are, or ``skewed``: two dense clusters at
    either end and a few between, where interpolation guesses far off) and random fp_lo."""
    rng = np.random.default_rng(seed)
    if skewed:
        parts = [rng.integers(1, 1 << 24, n), rng.integers(U64 - (1 << 24), U64 - 1, n, dtype=np.uint64),
                 rng.integers(1 << 40, 1 << 62, max(n // 50, 1), dtype=np.uint64)]
        pool = np.unique(np.concatenate([x.astype(np.uint64) for x in parts]))
        hi = np.sort(rng.choice(pool, n, replace=False))
    else:
        hi = np.unique(rng.integers(1, U64 - 1, size=n + 50, dtype=np.uint64))[:n]
    return hi, rng.integers(0, U64, size=n, dtype=np.uint64)


@pytest.mark.parametrize("skewed", [False, True], ids=["uniform", "skewed"])
@pytest.mark.parametrize("n,block_rows", [(5_549, 2_048), (1000, 100), (70_001, 65_536), (130, 64), (9, 7)])
def test_every_entry_and_its_neighbours_at_every_window_and_block_edge(fs, layout, n: int, block_rows: int,
                                                                       skewed: bool) -> None:
    """A summary's windows (64 entries at 2,048 and 65,536 a block, 50 at 100, 7 at 7), a last
    block shorter than the others, a last window shorter than the step, fingerprints uniform or
    clustered: every entry is found at its location, and fp_hi one below or above it, or its fp_hi
    with another fp_lo, is not."""
    io, root = fs
    hi, lo = _sorted_fps(n, seed=n, skewed=skewed)
    targets = [(f"p={i % 7}", f"f{i % 13}") for i in range(n)]
    path = f"{root}/b.arrow"
    write_index_file(io, path, IndexEntries.from_fingerprints(hi, lo, targets), block_rows=block_rows, layout=layout)
    # the neighbours of every entry near a block or window edge, and of 2,000 others
    edges = np.concatenate([np.arange(b - 70, b + 70) for b in range(0, n + 1, block_rows)])
    rng = np.random.default_rng(n)
    near = np.unique(np.concatenate([edges[(edges >= 0) & (edges < n)], rng.integers(0, n, 2000)]))
    live = np.ones(n, bool)
    live[1:] = hi[1:] - hi[:-1] > 1  # hi - 1 is another entry's fp_hi: not a miss to ask for
    below = near[live[near]]
    nh = np.concatenate([hi, hi[below] - np.uint64(1), hi[near] + np.uint64(1), hi[near], np.array([0, U64], np.uint64)])
    nl = np.concatenate([lo, lo[below], lo[near], lo[near] ^ np.uint64(1), np.array([0, U64], np.uint64)])
    at = {(h, l): t for h, l, t in zip(hi.tolist(), lo.tolist(), targets)}
    want = (targets + [None] * below.size
            + [at.get((h + 1, l)) for h, l in zip(hi[near].tolist(), lo[near].tolist())]  # another entry's fp_hi at most
            + [None] * near.size + [None, None])
    shuffle = np.random.default_rng(1).permutation(nh.size)
    for mode in MODES:
        res = lookup(io, [path], fp=(nh[shuffle], nl[shuffle]), mode=mode)
        assert _targets(res) == [want[i] for i in shuffle.tolist()], mode


def test_a_file_with_uneven_blocks_is_read_through_indexfile(local, cache) -> None:
    """An IPC file whose blocks differ in size (no writer of this package makes one; Arrow allows
    it) gets no summary: it is looked up as an IndexFile, with the same answers."""
    import json
    import os

    import pyarrow.ipc as ipc

    io, root = local
    hi, lo = _sorted_fps(15, seed=3)
    targets = [("p", f"f{i}") for i in range(15)]
    e = IndexEntries.from_fingerprints(hi, lo, targets)
    even, uneven = f"{root}/even.arrow", f"{root}/uneven.arrow"
    write_index_file(io, even, e, block_rows=5, layout=1)
    with IndexFile(io, even) as f:
        schema = f._reader.schema
        t = f.read_all()
    md = dict(schema.metadata)  # its block index, for the blocks written below
    md[b"bucketindex.block_first_hi"] = json.dumps([str(int(hi[i])) for i in (0, 5, 8)]).encode()
    schema = schema.with_metadata(md)
    with pa.OSFile(uneven, "wb") as sink, ipc.new_file(sink, schema) as w:
        for a, b in ((0, 5), (5, 8), (8, 15)):
            w.write_batch(pa.record_batch([t.column(c).combine_chunks()[a:b] for c in range(3)], schema=schema))
    for p in (even, uneven):
        _age(p)
    for p in (even, uneven):
        before = cache.cache_info()["files"]
        res = lookup(io, [p], fp=(np.concatenate([hi, hi + np.uint64(1)]), np.concatenate([lo, lo])))
        assert _targets(res) == targets + [None] * 15, os.path.basename(p)
        assert cache.cache_info()["files"] == before + (p == even)


def test_an_evicted_summary_is_built_again_and_one_over_the_bound_is_used_uncached(local, layout, cache) -> None:
    io, root = local
    maps = [{f"k{b}-{i}": (f"p={b}", f"f{i % 4}") for i in range(500)} for b in range(2)]
    paths = []
    for b, m in enumerate(maps):
        paths.append(_write(io, f"{root}/bucket={b}/base.arrow", m, block_rows=64, layout=layout))
        _age(paths[-1])
    delta = _write(io, f"{root}/bucket=0/delta.arrow", {"k0-1": None, "k0-2": ("p=9", "moved"), "new": ("p=9", "n")},
                   layout=layout)
    _age(delta)
    want0 = {**maps[0], "k0-2": ("p=9", "moved"), "new": ("p=9", "n")}
    want0.pop("k0-1")
    queries = [list(maps[0]), list(maps[1])]
    for q in queries:
        q += ["new", "absent"]
    cache.set_cache_limits(max_files=2)  # the two files of bucket 0, or one of each bucket
    for round_ in range(3):
        for b, files in ((0, [paths[0], delta]), (1, [paths[1]])):
            want = want0 if b == 0 else maps[1]
            assert _targets(lookup(io, files, queries[b])) == [want.get(k) for k in queries[b]], (round_, b)
    info = cache.cache_info()
    assert info["files"] == 2 and info["hits"] + info["misses"] == 9 and info["misses"] >= 5  # evicted, rebuilt
    cache.clear_cache()
    cache.set_cache_limits(max_bytes=1000)  # under one summary: each is built, used, not kept
    assert _targets(lookup(io, [paths[0], delta], queries[0])) == [want0.get(k) for k in queries[0]]
    info = cache.cache_info()
    assert info["files"] == 0 and info["bytes"] == 0 and info["misses"] == 2


def test_a_summary_is_counted_at_least_at_what_it_holds(local, cache) -> None:
    """The cache's byte bound counts a summary's sample, block offsets and location table; the
    decoded table (tracemalloc) stays under what it is counted at, for long and short names."""
    import json
    import tracemalloc

    from spark_jobs.index import record_index as ri

    io, root = local
    for name, locs in (("long", [(f"dt=2024-03-{p:02d}", f"{p * 50 + f:05d}-{uuid.UUID(int=p * 50 + f, version=4)}-0")
                                  for p in range(20) for f in range(50)]),
                       ("short", [(f"p={i}", f"f{i}") for i in range(1000)]),
                       ("odd", [("a]b", "é/ %+"), ("", "x")])):
        raw = json.dumps(locs, separators=(",", ":")).encode()
        tracemalloc.start()
        table = ri._decode_locations(raw)
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert table == locs, name
        assert held <= ri._location_bytes(raw), (name, held, ri._location_bytes(raw))
    rng = random.Random(5)
    mapping = {f"k{i}": rng.choice(locs) for i in range(5000)}
    p = _write(io, f"{root}/b.arrow", mapping, block_rows=1024)
    _age(p)
    assert _targets(lookup(io, [p], ["k1", "zz"])) == [mapping["k1"], None]
    (r,) = [r for _, r in ri._SUMMARIES._files.values()]
    assert r.step == 64 and r.sample.size == -(-5000 // 64)  # every 64th fp_hi, 8 bytes each
    with IndexFile(io, p) as f:
        table = json.dumps(f.locations, separators=(",", ":")).encode()
        assert r.sample[::16].tolist() == f.block_first_hi.tolist()  # 1,024 a block: every 16th sample
    assert cache.cache_info()["bytes"] == r.nbytes >= r.sample.nbytes + ri._location_bytes(table)
