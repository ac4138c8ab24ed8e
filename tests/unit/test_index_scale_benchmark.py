"""``benchmarks/index_scale.py`` (issue 38 item 3) at a tiny size: 3 buckets x 2,000 keys.

The script builds RFC-08's record index at 1,000 buckets x 1M keys; what must hold at any size
is checked here: its JSON result describes what it measured and checked (every batch size, hits
and misses, cold and warm, the generic FileIO, a compaction), its vectorised key routing is
the product's, the build resumes (a built bucket is skipped, a missing one rebuilt byte for
byte: keys come from the seed), its correctness check fails on a wrong index, and bad input
is refused with exit status 2 and the index left as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from spark_jobs.arrow_engine.keys import bucket_ids
from spark_jobs.index.hashing import fingerprints

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "index_scale.py"
TINY = ["--buckets", "3", "--entries-per-bucket", "2000"]


def run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), "--workdir", str(workdir), *args],
                          capture_output=True, text=True, env=env, timeout=120)


def bucket_file(workdir: Path, b: int) -> Path:
    return workdir / ".bucketindex" / "index" / f"bucket={b:05d}" / "base_00000000000001.arrow"


def digests(workdir: Path) -> dict[str, str]:
    return {str(p.relative_to(workdir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(workdir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    workdir = tmp_path_factory.mktemp("index_scale")
    r = run(workdir, *TINY, "--lookups", "100,1000", "--runs", "1")
    assert r.returncode == 0, r.stderr
    return workdir, json.loads(r.stdout.strip().splitlines()[-1])


def test_result_reports_every_measurement_checked(built):
    workdir, res = built
    files = [bucket_file(workdir, b) for b in range(3)]
    assert res["benchmark"] == "index_scale" and res["buckets_built"] == 3 and res["checked"] is True
    assert res["entries"] == 6000  # every key 0..5999 written, to whichever bucket it routes to
    assert res["index_bytes"] == sum(f.stat().st_size for f in files)
    assert res["bytes_per_entry"] == round(res["index_bytes"] / res["entries"], 3)
    assert sorted((r["keys"], r["kind"]) for r in res["lookups"]) == [
        (100, "hit"), (100, "miss"), (1000, "hit"), (1000, "miss")]
    for r in res["lookups"]:
        assert r["checked"] and r["buckets_touched"] == 3
        assert r["cold_ms"] > 0 and r["warm_ms"] > 0 and len(r["warm_runs_ms"]) == 1
        assert r["peak_rss_warm_mb"] >= r["rss_start_mb"] > 0
        if r["resident_before_cold"] is not None:  # fincore present: the cold case was cold
            assert r["resident_before_cold"] < 0.05
    assert res["lookup_1k_warm_ms"] == next(r["warm_ms"] for r in res["lookups"] if r["keys"] == 1000
                                            and r["kind"] == "hit")
    assert [r["keys"] for r in res["no_mmap"]] == [100, 1000]
    assert all(r["checked"] and r["reads"] > 0 and r["read_mb"] > 0 for r in res["no_mmap"])
    assert res["open_ms_per_bucket"] > 0
    comp = res["compaction"]
    assert comp["checked"] and comp["bucket"] == 0 and comp["deltas"] == 3
    assert comp["base_entries"] > 0 and comp["entries_after"] > 0 and comp["total_ms"] > 0
    assert not (workdir / "compaction_scratch").exists()  # the scratch files are removed
    assert res["index_layout"] == 1 and res["index_layouts"] == [1]  # the default: what every release reads


def test_routing_is_the_products(built):
    """The vectorised key generation and XXH64 agree with the product's ``bucket_ids`` and
    ``fingerprints`` of the same strings, and each built bucket holds exactly its keys."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import index_scale as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    workdir, _ = built
    ids = np.arange(6000, dtype=np.uint64)
    keys = bench.key_strings(ids, 8)
    assert len(set(keys)) == 6000 and all(len(k) == 36 and k[14] == "4" for k in keys)
    routed = bench.route(ids, 8, 3)
    assert np.array_equal(routed, bucket_ids(pa.array(keys), 3))
    from spark_jobs.index.record_index import IndexFile
    from spark_jobs.io.filesystem import resolve
    io, _ = resolve(str(workdir))
    for b in range(3):
        with IndexFile(io, str(bucket_file(workdir, b))) as f:
            e = f.entries()
        hi, lo = fingerprints([k for k, r in zip(keys, routed.tolist()) if r == b])
        order = np.lexsort((lo, hi))
        assert np.array_equal(e.fp_hi, hi[order]) and np.array_equal(e.fp_lo, lo[order])


def test_build_resumes_and_rebuilds_a_bucket_identically(built, tmp_path):
    src, _ = built
    workdir = tmp_path / "idx"
    shutil.copytree(src, workdir)
    before = digests(workdir)
    kept = {b: bucket_file(workdir, b).stat().st_mtime_ns for b in (0, 2)}
    bucket_file(workdir, 1).unlink()
    r = run(workdir, *TINY, "--build-only")
    assert r.returncode == 0, r.stderr
    assert "2 buckets already built (skipped), 1 to build now" in r.stdout
    assert {b: bucket_file(workdir, b).stat().st_mtime_ns for b in (0, 2)} == kept  # not rewritten
    after = digests(workdir)
    rel = str(bucket_file(workdir, 1).relative_to(workdir))
    assert after[rel] == before[rel]  # the same keys again: from the seed, not stored
    r = run(workdir, *TINY, "--build-only")
    assert "3 buckets already built (skipped), 0 to build now" in r.stdout


def test_correctness_check_catches_a_wrong_index(built, tmp_path):
    """Bucket 1's file replaced by bucket 2's: its keys are not found, and the run fails."""
    src, _ = built
    workdir = tmp_path / "idx"
    shutil.copytree(src, workdir)
    shutil.copyfile(bucket_file(workdir, 2), bucket_file(workdir, 1))
    r = run(workdir, *TINY, "--no-build", "--lookups", "1000", "--runs", "1")
    assert r.returncode == 1
    assert "AssertionError: hit 1,000 cold:" in r.stderr and "hits not found" in r.stderr


def test_index_layout_2_is_built_and_measured_when_asked(built, tmp_path):
    """``--index-layout 2`` writes every file in layout 2 (the location table once): the same
    entries, checked the same way, in fewer bytes -- bases and the compacted base alike."""
    _, res1 = built
    workdir = tmp_path / "idx2"
    r = run(workdir, *TINY, "--lookups", "100,1000", "--runs", "1", "--index-layout", "2")
    assert r.returncode == 0, r.stderr
    res2 = json.loads(r.stdout.strip().splitlines()[-1])
    assert res2["checked"] is True and res2["index_layout"] == 2 and res2["index_layouts"] == [2]
    assert res2["entries"] == res1["entries"] == 6000
    assert res2["index_bytes"] < res1["index_bytes"]
    c1, c2 = res1["compaction"], res2["compaction"]
    assert c2["entries_after"] == c1["entries_after"] and c2["bytes_after"] < c1["bytes_after"]


def test_building_into_an_index_of_the_other_layout_is_refused(built, tmp_path):
    src, _ = built
    workdir = tmp_path / "idx"
    shutil.copytree(src, workdir)
    bucket_file(workdir, 1).unlink()
    before = digests(workdir)
    r = run(workdir, *TINY, "--build-only", "--index-layout", "2")
    assert r.returncode == 2
    assert "holds index files of layout 1; asked to build layout 2" in r.stderr
    assert digests(workdir) == before


@pytest.mark.parametrize("args, message", [
    (["--buckets", "0", "--entries-per-bucket", "2000"], "--buckets must be positive"),
    (["--lookups", "10,x"], "comma-separated integers"),
    ([*TINY, "--seed", "9"], "built with other parameters: seed 8 (asked 9)"),
    ([*TINY, "--index-layout", "3"], "--index-layout: invalid choice: 3"),
])
def test_bad_input_exits_2_and_leaves_the_index(built, tmp_path, args, message):
    src, _ = built
    workdir = tmp_path / "idx"
    shutil.copytree(src, workdir)
    before = digests(workdir)
    r = run(workdir, *args)
    assert r.returncode == 2
    assert message in r.stderr and r.stdout == ""
    assert digests(workdir) == before
