"""The skew report (issue 12): bucket sizes of real tables built with the pure-Python core,
their stats, the suggested bucket count and ``bucketindex show`` / ``--json`` / ``--plot``."""

from __future__ import annotations

import json
import random
import sys
from urllib.parse import quote_plus

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.cli import main
from spark_jobs.index.hashing import buckets_of
from spark_jobs.index.record_index import IndexEntries, write_index_file
from spark_jobs.table import skew
from spark_jobs.table.action.transaction import Transaction
from spark_jobs.table.config import TableConfig
from spark_jobs.table.skew import MAX_BUCKETS, bucket_sizes, candidate_counts, suggest_num_buckets
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action
from spark_jobs.table.view import encode_schema

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("id", pa.string()), ("v", pa.int64()), ("_bi_key", pa.string())])
#: partition values with a space, '/', '%', '+' and non-ASCII; paths hold them URL-encoded as Spark's url_encode does
REGIONS = ("EU west", "a/b", "100%", "x+y", "café ü")
PNG = b"\x89PNG\r\n\x1a\n"


def ppath(value: str) -> str:
    return f"region={quote_plus(value)}"


def keys_in(bucket: int, count: int, n: int, tag: str) -> list[str]:
    """``count`` distinct keys that hash to ``bucket`` of ``n`` (odd characters included)."""
    out: list[str] = []
    start = 0
    while len(out) < count:
        pool = [f"{tag}/k {i}+é%" for i in range(start, start + 4 * n * count + 16)]
        out += [k for k, b in zip(pool, buckets_of(pool, n)) if b == bucket][: count - len(out)]
        start += len(pool)
    return out


def commit(t: Table, file_groups: list[dict], index_added: list[dict] | None = None, *, writes=()) -> str:
    """One commit through the real Transaction: data files written, then the metadata."""
    txn = Transaction(t, Action.COMMIT, {"batch_id": f"b{len(t.timeline.reload().completed())}"}).begin()
    metas = []
    for fg, keys in zip(file_groups, writes):
        rel = f"{fg['partition'] + '/' if fg['partition'] else ''}{fg['file_id']}_0-0-0_{txn.ts}.parquet"
        t.create_marker(txn.ts, rel)
        t.io.mkdirs(t.abs(rel).rsplit("/", 1)[0])
        pq.write_table(pa.table({"id": keys, "v": list(range(len(keys))), "_bi_key": keys}, schema=SCHEMA), t.abs(rel))
        metas.append({**fg, "path": rel, "num_rows": len(keys)})
    txn.commit({"batch_id": txn.plan["batch_id"], "schema": encode_schema(SCHEMA),
                "index": {"added": index_added or []}, "file_groups": metas})
    return txn.ts


def bucket_table(root, n: int, sizes: dict[str, list[int]], *, target_file_rows: int = 100) -> Table:
    """A ``bucket``-index table partitioned by region: ``sizes[region][b]`` rows in bucket
    ``b``'s file group (keys that really hash there); a 0 means no file group at all."""
    t = Table.open(str(root))
    t.create(TableConfig(record_key_fields=["id"], index_type="bucket", num_buckets=n,
                         partition_fields=["region"], target_file_rows=target_file_rows))
    groups, writes = [], []
    for region, per in sizes.items():
        for b, count in enumerate(per):
            if count:
                groups.append({"partition": ppath(region), "file_id": f"{b:08d}"})
                writes.append(keys_in(b, count, n, region))
    commit(t, groups, writes=writes)
    return t


def record_table(root, n: int, commits: list[dict[int, list[str]]]) -> Table:
    """A ``record``-index table: per commit, the keys each index bucket's delta holds (each
    key in the bucket it hashes to), all pointing at one data file group."""
    t = Table.open(str(root))
    t.create(TableConfig(record_key_fields=["id"], index_type="record", num_buckets=n, partition_fields=["region"]))
    for i, per in enumerate(commits):
        txn = Transaction(t, Action.COMMIT, {"batch_id": f"r{i}"}).begin()
        part = ppath(REGIONS[i % len(REGIONS)])
        rel = f"{part}/fg{i}_0-0-0_{txn.ts}.parquet"
        keys = [k for ks in per.values() for k in ks]
        t.create_marker(txn.ts, rel)
        t.io.mkdirs(t.abs(part))
        pq.write_table(pa.table({"id": keys, "v": [i] * len(keys), "_bi_key": keys}, schema=SCHEMA), t.abs(rel))
        added = []
        for b, ks in per.items():
            assert set(buckets_of(ks, n).tolist()) <= {b}
            path = t.layout.index_file(b, "delta", txn.ts)
            t.create_marker(txn.ts, t.layout.rel(path))
            write_index_file(t.io, path, IndexEntries.from_keys(ks, [(part, f"fg{i}")] * len(ks)))
            added.append({"bucket": b, "path": t.layout.rel(path), "kind": "delta"})
        txn.commit({"batch_id": f"r{i}", "schema": encode_schema(SCHEMA), "index": {"added": added},
                    "file_groups": [{"partition": part, "file_id": f"fg{i}", "path": rel, "num_rows": len(keys)}]})
    return t


def show(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["show", *args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# -- the suggestion rule -----------------------------------------------------------------

def test_candidates_are_multiples_and_divisors_up_to_the_maximum():
    assert candidate_counts(12) == [3, 6, 12, 24, 48, 96, 192, 384, 768, 1536, 3072, 6144, 12288, 24576, 49152]
    assert candidate_counts(5)[0] == 5 and candidate_counts(5)[-1] == 40960
    assert candidate_counts(1)[:3] == [1, 2, 4] and candidate_counts(1)[-1] == MAX_BUCKETS
    assert candidate_counts(MAX_BUCKETS) == [2 ** j for j in range(17)]


def test_grows_to_the_smallest_count_that_fits_with_30_percent_headroom():
    s = suggest_num_buckets(8, 2000, 100)
    # 2000 / m * 1.3 <= 100 needs m >= 26: 16 is not enough, 32 is
    assert (s["num_buckets"], s["action"]) == (32, "grow")
    assert "2,000 rows" in s["reason"] and "325 with 30% headroom" in s["reason"] and "at 32 buckets: 81" in s["reason"]
    # exactly at the target (1000 / 13 * 1.3 == 100) still fits: no rehash
    assert suggest_num_buckets(13, 1000, 100)["action"] == "keep"
    assert suggest_num_buckets(13, 1001, 100) == {**suggest_num_buckets(13, 1001, 100), "num_buckets": 26, "action": "grow"}


def test_shrinks_only_far_under_the_target_and_never_flaps():
    s = suggest_num_buckets(64, 100, 100)
    # half (32) gives 4 <= 25: shrink, to the smallest divisor under 25 (130 / 8 = 16.25; 4 would give 32.5)
    assert (s["num_buckets"], s["action"]) == (8, "shrink")
    assert suggest_num_buckets(8, 100, 100)["action"] == "keep"  # and there it stays
    # right-sized, and even comfortably under the target: no shrink while half would pass target/4
    assert suggest_num_buckets(16, 400, 100)["action"] == "keep"  # half: 65 > 25
    assert suggest_num_buckets(16, 1000, 100)["action"] == "keep"  # 81 <= 100
    # an odd count has no divisor of the form N / 2**j below it
    assert suggest_num_buckets(7, 1, 100) == {**suggest_num_buckets(7, 1, 100), "num_buckets": 7, "action": "keep"}
    assert suggest_num_buckets(12, 1, 100)["num_buckets"] == 3  # 12 -> 6 -> 3, never 1 (not 12 / 2**j)
    assert suggest_num_buckets(16, 0, 100)["action"] == "keep"  # empty: nothing to size by


def test_caps_at_the_maximum():
    s = suggest_num_buckets(3, 10 ** 9, 100)
    assert (s["num_buckets"], s["action"]) == (49152, "grow") and "capped" in s["reason"]
    s = suggest_num_buckets(MAX_BUCKETS, 10 ** 12, 100)
    assert (s["num_buckets"], s["action"]) == (MAX_BUCKETS, "keep") and "most buckets" in s["reason"]


def test_every_suggestion_is_reachable_and_stable():
    rnd = random.Random(12)
    for _ in range(3000):
        n = rnd.choice([1, 2, 3, 5, 6, 8, 12, 16, 48, 100, 256, 4096, 65536])
        load = rnd.choice([0, rnd.randrange(1, 1000), rnd.randrange(1, 10 ** 6), rnd.randrange(1, 10 ** 11)])
        target = rnd.choice([10, 100, 100_000, 1_000_000])
        s = suggest_num_buckets(n, load, target)
        m = s["num_buckets"]
        assert 1 <= m <= max(n, MAX_BUCKETS)
        assert m % n == 0 or n % m == 0, (n, m)
        assert m in candidate_counts(n)
        assert s["action"] == ("grow" if m > n else "shrink" if m < n else "keep")
        if load and load * 1.3 / m <= target:  # unless capped, asking again at m changes nothing
            assert suggest_num_buckets(m, load, target)["num_buckets"] == m, (n, load, target, m)


# -- bucket index ------------------------------------------------------------------------

def test_bucket_index_sizes_per_file_group_and_per_bucket(tmp_path):
    sizes = {"EU west": [5, 7, 0, 6], "a/b": [40, 1, 2, 3], "café ü": [0, 0, 9, 0]}
    t = bucket_table(tmp_path / "t", 4, sizes, target_file_rows=100)
    r = bucket_sizes(t, t.view())
    assert r["bucketed"] and r["index_type"] == "bucket" and r["num_buckets"] == 4
    fg = r["per_file_group"]
    assert fg["partitions"] == {ppath(k): v for k, v in sizes.items()}  # missing file groups count as 0
    groups = np.array([v for per in sizes.values() for v in per])
    assert fg["stats"] == {"count": 12, "min": 0, "median": float(np.median(groups)),
                           "p99": round(float(np.percentile(groups, 99)), 1), "max": 40,
                           "mean": round(float(groups.mean()), 1), "total": 73}
    assert r["per_bucket"]["sizes"] == [45, 8, 11, 9]
    assert r["per_bucket"]["stats"]["max"] == 45 and r["per_bucket"]["stats"]["median"] == 10.0
    # the busiest partition decides: a/b's 46 rows over 4 groups, 15 with headroom, fit 100 rows per group
    assert r["busiest_partition"] == {"partition": ppath("a/b"), "rows": 46, "max_per_file_group": 40}
    assert r["suggestion"]["action"] == "keep" and "a%2Fb" in r["suggestion"]["reason"]
    assert r["skew"] is None  # p99 under the target


def test_big_partition_grows_the_count_and_show_prints_the_command(tmp_path, capsys):
    sizes = {"EU west": [30, 31, 29, 30], "x+y": [2, 1, 0, 1], "100%": [3, 3, 3, 3]}
    t = bucket_table(tmp_path / "my table", 4, sizes, target_file_rows=20)
    rc, out, err = show(capsys, t.uri)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("buckets ")))
    block = lines[first:first + 5]
    assert block[0] == ("buckets    rows per file group (4 buckets x 3 partitions): "
                        "min 0, median 3.0, p99 30.9, max 31, mean 11.3")
    assert block[1] == "  per bucket over all partitions: min 32, median 34.5, p99 35.0, max 35, mean 34.0"
    assert block[2] == "  busiest partition region=EU+west: 120 rows, at most 31 in a file group"
    # 120 rows * 1.3 / m <= 20 needs m >= 7.8: 8 buckets
    assert block[3].startswith("  suggested 8 buckets (grow): the busiest partition region=EU+west holds 120 rows")
    assert block[4] == f"  to apply: bucketindex rehash '{t.uri}' --num-buckets 8"

    rc, out, _ = show(capsys, t.uri, "--json")
    d = json.loads(out)["bucket_sizes"]
    assert d["suggestion"]["num_buckets"] == 8 and d["target"] == 20
    assert d["per_file_group"]["partitions"][ppath("x+y")] == [2, 1, 0, 1]
    assert d["per_file_group"]["partitions"][ppath("100%")] == [3, 3, 3, 3]


def test_tiny_buckets_suggest_shrinking(tmp_path, capsys):
    t = bucket_table(tmp_path / "t", 16, {"a/b": [1] * 16}, target_file_rows=100)
    rc, out, _ = show(capsys, t.uri)
    assert rc == 0
    # 16 rows: half (8) gives 2.6 <= 25; shrink to the smallest divisor under 25: 1 bucket gives 20.8
    assert "  suggested 1 bucket (shrink):" in out and "--num-buckets 1\n" in out
    assert "buckets    rows per file group (16 buckets x 1 partition): min 1, median 1.0, p99 1.0, max 1," in out


def test_a_hot_bucket_is_skew_in_the_keys_not_a_bucket_count(tmp_path, capsys):
    # bucket 0 holds 60 rows, the rest 4: the mean (11.5, 15 with headroom) fits 20 per group, p99 does not
    t = bucket_table(tmp_path / "t", 8, {"café ü": [60, 4, 4, 4, 4, 4, 4, 4]}, target_file_rows=20)
    r = bucket_sizes(t, t.view())
    assert r["suggestion"]["action"] == "keep"
    assert r["skew"] is not None and "more buckets will not help a hot key" in r["skew"]
    assert "14.0x the median" in r["skew"]  # p99 56.1 (interpolated) over a median of 4
    rc, out, _ = show(capsys, t.uri)
    assert "  skew: p99 56 rows per file group is 14.0x the median and over the target 20" in out
    assert "rehash" not in out  # nothing to apply
    # an even table of the same size is not skewed
    even = bucket_table(tmp_path / "even", 8, {"café ü": [12] * 8}, target_file_rows=20)
    assert bucket_sizes(even, even.view())["skew"] is None


def test_sizes_follow_the_snapshot(tmp_path):
    t = bucket_table(tmp_path / "t", 2, {"EU west": [3, 4]})
    first = t.view()
    commit(t, [{"partition": ppath("EU west"), "file_id": "00000001"}], writes=[keys_in(1, 9, 2, "EU west")])
    assert bucket_sizes(t, first)["per_bucket"]["sizes"] == [3, 4]
    assert bucket_sizes(t, t.view())["per_bucket"]["sizes"] == [3, 9]  # the rewritten group's live rows


def test_the_rehash_accepts_every_suggestion(tmp_path):
    from spark_jobs.table.action.rehash import check_rehash

    cases = {"grow": [40, 40, 40, 40], "shrink": [1, 0, 0, 1], "keep": [5, 6, 5, 6]}
    for action, per in cases.items():
        t = bucket_table(tmp_path / action, 4, {"a/b": per}, target_file_rows=20)
        view = t.view()
        s = bucket_sizes(t, view)["suggestion"]
        assert s["action"] == action
        plan = check_rehash(t, view, s["num_buckets"])
        assert (plan is None) if action == "keep" else (plan.new == s["num_buckets"])


# -- record index ------------------------------------------------------------------------

def test_record_index_counts_entries_per_bucket_from_the_footers(tmp_path, capsys, monkeypatch):
    n = 4
    b0, b2 = keys_in(0, 30, n, "r"), keys_in(2, 5, n, "r")
    # the second commit moves 10 of bucket 0's keys: 10 more entries in a delta, not more keys
    t = record_table(tmp_path / "t", n, [{0: b0, 2: b2}, {0: b0[:10]}])
    r = bucket_sizes(t, t.view())
    assert r["index_type"] == "record" and r["unit"] == "entries"
    assert r["per_bucket"]["sizes"] == [40, 0, 5, 0]  # buckets 1 and 3 have no files: 0
    assert r["per_bucket"]["stats"] == {"count": 4, "min": 0, "median": 2.5, "p99": 38.9, "max": 40,
                                        "mean": 11.2, "total": 45}
    assert "upper bound of the live keys" in r["note"]
    assert r["target"] == 1_000_000 and r["suggestion"]["action"] == "shrink"  # 45 entries in 4 buckets
    assert r["suggestion"]["num_buckets"] == 1

    monkeypatch.setattr(skew, "RECORD_BUCKET_TARGET", 10)  # 45 * 1.3 / m <= 10: 8 buckets
    rc, out, _ = show(capsys, t.uri)
    assert rc == 0
    assert ("buckets    entries per index bucket (4 buckets): min 0, median 2.5, p99 38.9, max 40, mean 11.2"
            in out)
    assert "  entries in the index files: before compaction the deltas' updates" in out
    assert "  suggested 8 buckets (grow): the index holds 45 entries: 11 per index bucket at 4 buckets" in out
    assert f"  to apply: bucketindex rehash {t.uri} --num-buckets 8" in out


def test_global_simple_is_not_bucketed(tmp_path, capsys):
    t = Table.open(str(tmp_path / "t"))
    t.create(TableConfig(record_key_fields=["id"], index_type="global_simple"))
    commit(t, [{"partition": "", "file_id": "ab" * 16}], writes=[["a", "b"]])
    assert bucket_sizes(t, t.view()) == {"bucketed": False, "index_type": "global_simple",
                                         "reason": "a global_simple index has no buckets: nothing to rehash"}
    rc, out, _ = show(capsys, t.uri)
    assert rc == 0 and "buckets    not bucketed: a global_simple index has no buckets: nothing to rehash" in out
    assert json.loads(show(capsys, t.uri, "--json")[1])["bucket_sizes"]["bucketed"] is False
    png = tmp_path / "p.png"
    rc, out, err = show(capsys, t.uri, "--plot", str(png))
    assert rc == 2 and out == "" and err.count("\n") == 1 and "no buckets" in err and not png.exists()


# -- show --plot -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["bucket", "bucket-many-partitions", "record"])
def test_plot_writes_a_png(tmp_path, capsys, kind):
    if kind == "record":
        t = record_table(tmp_path / "t", 4, [{0: keys_in(0, 8, 4, "r"), 3: keys_in(3, 2, 4, "r")}])
    else:
        regions = REGIONS if kind == "bucket" else [f"{r} {i}" for r in REGIONS for i in range(2)]
        t = bucket_table(tmp_path / "t", 4, {r: [i + 1, 2, 0, 5] for i, r in enumerate(regions)})
    png = tmp_path / "plots" / "sizes é.png"
    png.parent.mkdir()
    rc, out, err = show(capsys, t.uri, "--plot", str(png))
    assert rc == 0 and err == "" and f"\nplot       {png}\n" in out
    data = png.read_bytes()
    assert data[:8] == PNG and len(data) > 1000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (800, 450)  # the 8 x 4.5 in figure at 100 dpi
    # with --json the output stays one JSON document
    rc, out, _ = show(capsys, t.uri, "--json", "--plot", str(png))
    assert rc == 0 and json.loads(out)["bucket_sizes"]["bucketed"]


def test_plot_without_matplotlib_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    t = bucket_table(tmp_path / "t", 2, {"x+y": [1, 2]})
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib... raises ImportError
    png = tmp_path / "p.png"
    rc, out, err = show(capsys, t.uri, "--plot", str(png))
    assert rc == 2 and out == "" and not png.exists()
    assert err == ("bucketindex: error: --plot needs matplotlib: pip install 'airflow-provider-bucketindex[plot]' "
                   "(or pip install 'matplotlib>=3.8')\n")


def test_plot_into_a_missing_directory_is_bad_input(tmp_path, capsys):
    t = bucket_table(tmp_path / "t", 2, {"x+y": [1, 2]})
    rc, out, err = show(capsys, t.uri, "--plot", str(tmp_path / "no" / "p.png"))
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("bucketindex: error: --plot: cannot write")
