"""``validate`` must catch every kind of index/data disagreement, with counts and sample keys."""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from spark_jobs.index.record_index import IndexEntries, write_index_file
from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
from spark_jobs.jobs.validate import run_validate
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action
from tests.spark.conftest import write_batch

pytestmark = pytest.mark.spark

ROWS = [{"id": f"k{i:02d}", "region": ["eu", "us"][i % 2], "ts": i} for i in range(40)]


def make_table(spark, tmp_path, index="record") -> Table:
    uri = str(tmp_path / "t")
    run_upsert(spark, UpsertOptions(table=uri, source=write_batch(tmp_path / "b.parquet", ROWS), record_key=["id"],
                                    precombine_field="ts", partition_field="region", index=index, num_buckets=2))
    return Table.load(uri)


def tamper_commit(t: Table, metadata: dict) -> None:
    inst = t.timeline.transition_to_inflight(t.timeline.create_requested(Action.COMMIT, {"batch_id": "tamper"}))
    t.timeline.complete(inst, {"batch_id": "tamper", **metadata})


def add_index_delta(t: Table, bucket: int, keys: list[str], targets: list) -> None:
    path = t.layout.index_file(bucket, "delta", "29990101000000000")
    write_index_file(t.io, path, IndexEntries.from_keys(keys, targets))
    tamper_commit(t, {"index": {"added": [{"bucket": bucket, "path": t.layout.rel(path), "kind": "delta"}]}})


def bucket_of_key(t: Table, key: str) -> int:
    from spark_jobs.index.hashing import bucket_of

    return bucket_of(key, t.num_buckets())


def test_clean_table_passes(spark, tmp_path):
    report = run_validate(spark, make_table(spark, tmp_path).uri)
    assert report["ok"] and report["rows"] == 40 and report["index_entries"] == 40
    assert report["rows_expected"] == 40 and "row_count_mismatch" not in report["problems"]


@pytest.mark.parametrize("index", ["record", "global_simple"])
def test_data_file_with_fewer_rows_than_its_commit(spark, tmp_path, index):
    """Rows validate cannot read must not pass silently: a file replaced by one holding fewer
    rows (same schema), and one holding none, are each a row count mismatch."""
    t = make_table(spark, tmp_path, index=index)
    short, empty = t.view().slices()[:2]
    rows = pq.read_table(t.abs(short.path))
    pq.write_table(rows.slice(0, rows.num_rows // 2), t.abs(short.path))
    pq.write_table(rows.schema.empty_table(), t.abs(empty.path))
    report = run_validate(spark, t.uri)
    assert not report["ok"]
    mismatch = report["problems"]["row_count_mismatch"]
    assert mismatch["count"] == 2
    assert sorted(mismatch["samples"]) == sorted([
        f"{short.partition}/{short.file_id}: expected {short.num_rows}, read {rows.num_rows // 2}",
        f"{empty.partition}/{empty.file_id}: expected {empty.num_rows}, read 0",
    ])
    assert report["rows_expected"] == t.view().num_rows
    assert report["rows"] == report["rows_expected"] - (short.num_rows - rows.num_rows // 2) - empty.num_rows


def test_key_missing_from_index(spark, tmp_path):
    t = make_table(spark, tmp_path)
    add_index_delta(t, bucket_of_key(t, "k07"), ["k07"], [None])  # a tombstone for a live key
    report = run_validate(spark, t.uri)
    assert not report["ok"]
    assert report["problems"]["keys_missing_from_index"] == {"count": 1, "samples": ["k07"]}


def test_index_points_to_wrong_file_and_orphan_entry(spark, tmp_path):
    t = make_table(spark, tmp_path)
    b = bucket_of_key(t, "k03")
    ghost = next(k for k in (f"ghost{i}" for i in range(100)) if bucket_of_key(t, k) == b)
    add_index_delta(t, b, ["k03", ghost], [("region=us", "no-such-file"), ("region=eu", "x")])
    p = run_validate(spark, t.uri)["problems"]
    assert p["index_points_to_wrong_file"] == {"count": 1, "samples": ["k03"]}
    assert p["index_entries_without_row"]["count"] == 1


def test_entry_in_wrong_bucket(spark, tmp_path):
    t = make_table(spark, tmp_path)
    right = bucket_of_key(t, "k05")
    loc = next(fg for fg in t.view().slices() if "k05" in pq.read_table(t.abs(fg.path)).column("_bi_key").to_pylist())
    add_index_delta(t, 1 - right, ["k05"], [(loc.partition, loc.file_id)])
    p = run_validate(spark, t.uri)["problems"]
    assert p["index_entries_in_wrong_bucket"]["samples"] == ["k05"]


def test_duplicate_key_and_bucket_placement(spark, tmp_path):
    t = make_table(spark, tmp_path, index="bucket")
    s = t.view().slices("region=eu")[0]
    rows = pq.read_table(t.abs(s.path))
    # the same rows again in a file group of another bucket: duplicates, and in the wrong bucket
    other = next(f"{b:08d}" for b in range(2) if f"{b:08d}" != s.file_id)
    rel = f"region=eu/{other}_9-9-9_29990101000000000.parquet"
    pq.write_table(rows, t.abs(rel))
    tamper_commit(t, {"file_groups": [{"partition": "region=eu", "file_id": other, "path": rel,
                                       "num_rows": rows.num_rows}]})
    p = run_validate(spark, t.uri)["problems"]
    assert p["duplicate_keys"]["count"] == rows.num_rows
    assert p["rows_in_wrong_bucket"]["count"] == rows.num_rows


def test_cli_validate_exits_1_on_mismatch(spark, tmp_path):
    t = make_table(spark, tmp_path)
    add_index_delta(t, bucket_of_key(t, "k11"), ["k11"], [None])
    p = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "validate", t.uri, "--master", "local[1]"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    assert '"keys_missing_from_index"' in p.stdout and "k11" in p.stdout
    assert p.stderr.strip().splitlines()[-1] == "bucketindex: validate found problems: keys_missing_from_index"


# -- the two engines: the same report ------------------------------------------------------

def _validate_both(spark, uri):  # type: ignore[no-untyped-def]
    """The Spark job's report, asserted equal to the in-process engine's."""
    from spark_jobs.arrow_engine.validate import run_validate as run_in_process

    on_spark = run_validate(spark, uri)
    assert run_in_process(uri) == on_spark
    return on_spark


def _live_locations(t: Table) -> dict[str, tuple[str, str]]:
    from spark_jobs.table.reader import read_slice

    out = {}
    for s in t.view().slices():
        for k in read_slice(t, s.path, [lf.path for lf in s.logs], columns=["_bi_key"]).column("_bi_key").to_pylist():
            out[k] = (s.partition, s.file_id)
    return out


def _add_entries(t: Table, n: int, bucket: int, keys: list[str], targets: list) -> None:
    path = t.layout.index_file(bucket, "delta", f"2999010100000000{n}")
    write_index_file(t.io, path, IndexEntries.from_keys(keys, targets))
    tamper_commit(t, {"index": {"added": [{"bucket": bucket, "path": t.layout.rel(path), "kind": "delta"}]}})


def _duplicate_group(t: Table, fid: str) -> int:
    """The rows of a partition's largest base again, in a new file group ``fid`` of that partition."""
    s = max(t.view().slices(), key=lambda s: s.num_rows)
    rows = pq.read_table(t.abs(s.path))
    rel = f"{s.partition}/{fid}_9-9-9_29990101000000000.parquet"
    pq.write_table(rows, t.abs(rel))
    tamper_commit(t, {"file_groups": [{"partition": s.partition, "file_id": fid, "path": rel,
                                       "num_rows": rows.num_rows}]})
    return rows.num_rows


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
@pytest.mark.parametrize("index", ["record", "bucket", "global_simple"])
def test_engines_give_the_same_report(spark, tmp_path, index, table_type):
    """``validate`` on Spark and in-process (``--engine arrow``): equal reports on a sound table,
    on one with broken index entries or misplaced and duplicated rows, and on one missing a data file."""
    from tests.spark.test_upsert_oracle import _dedupe_ties, make_batches

    batches = make_batches(seed=23, n_batches=2, pool=120, size=80)
    _dedupe_ties(batches, index == "bucket")
    uri = str(tmp_path / "t")
    for i, rows in enumerate(batches):
        run_upsert(spark, UpsertOptions(
            table=uri, source=write_batch(tmp_path / f"b{i}.parquet", rows), record_key=["id"],
            precombine_field="ts", partition_field="region", index=index, num_buckets=4, delete_field="is_deleted",
            batch_id=f"b{i}", target_file_rows=30, table_type=table_type,
            auto_compact="off" if table_type == "merge_on_read" else None))  # validate must merge the logs
    t = Table.load(uri)
    if table_type == "merge_on_read":
        assert any(s.logs for s in t.view().slices())
    sound = _validate_both(spark, uri)
    assert sound["ok"] and sound["rows"] == sound["rows_expected"] > 0

    nb = t.num_buckets()
    if index == "record":
        locs = _live_locations(t)
        gone, moved, misplaced = sorted(locs)[:3]
        wrong = next(loc for loc in set(locs.values()) if loc != locs[moved])
        b = bucket_of_key(t, gone)
        ghost = next(k for k in (f"ghost{i}" for i in range(1000)) if bucket_of_key(t, k) == b)
        _add_entries(t, 1, b, [gone, ghost], [None, ("region=eu", "no-such-file")])
        _add_entries(t, 2, bucket_of_key(t, moved), [moved], [wrong])
        _add_entries(t, 3, (bucket_of_key(t, misplaced) + 1) % nb, [misplaced], [locs[misplaced]])
        expected = {"keys_missing_from_index", "index_entries_without_row", "index_points_to_wrong_file",
                    "index_entries_in_wrong_bucket"}
    else:  # rows of a file group copied into one of no bucket: duplicated (and misplaced) keys
        copied = _duplicate_group(t, f"{nb + 3:08d}")
        assert copied > 5  # more than are sampled: both engines sample the smallest keys
        expected = {"duplicate_keys"} | ({"rows_in_wrong_bucket"} if index == "bucket" else set())
        if index == "global_simple":  # and a base that reads short
            s = min(t.view().slices(), key=lambda s: s.num_rows)
            rows = pq.read_table(t.abs(s.path))
            pq.write_table(rows.slice(0, rows.num_rows // 2), t.abs(s.path))
            expected.add("row_count_mismatch")
    broken = _validate_both(spark, uri)
    assert not broken["ok"] and set(broken["problems"]) == expected, broken["problems"]

    import os

    os.remove(t.abs(t.view().slices()[0].path))
    missing = _validate_both(spark, uri)
    assert set(missing["problems"]) == {"data_files_missing"}


def test_cli_validate_auto_over_budget_runs_on_spark(spark, tmp_path, monkeypatch, caplog):
    """``--engine auto`` with a budget the table does not fit: Spark checks it (no JVM started here:
    the session and the job are stand-ins), and the choice is logged with its reason."""
    import spark_jobs.cli as cli
    import spark_jobs.jobs.validate as spark_validate
    from spark_jobs.arrow_engine.validate import run_validate as run_in_process

    t = make_table(spark, tmp_path)
    ran = []
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    monkeypatch.setattr(cli, "_spark", lambda args, submitted: "session")
    monkeypatch.setattr(spark_validate, "run_validate", lambda s, uri: ran.append(s) or run_in_process(uri))
    with caplog.at_level("INFO", logger="bucketindex.engine"):
        assert cli.main(["validate", t.uri, "--memory-budget", "1k"]) == 0
    assert ran == ["session"]
    assert any("engine: spark (needs about" in r.getMessage() and "over the 1 KiB budget" in r.getMessage()
               for r in caplog.records)
    ran.clear()
    caplog.clear()
    with caplog.at_level("INFO", logger="bucketindex.engine"):
        assert cli.main(["validate", t.uri]) == 0  # fits the machine's budget: in-process
    assert ran == [] and any("engine: arrow (needs about" in r.getMessage() for r in caplog.records)


#: runs the CLI, then fails if anything imported pyspark or py4j (the way a JVM would start)
_NO_SPARK = """
import runpy, sys
sys.argv = ["bucketindex", *sys.argv[1:]]
try:
    runpy.run_module("spark_jobs.cli", run_name="__main__")
    code = 0
except SystemExit as e:
    code = e.code
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j"))
assert not bad, f"imported {bad[:5]}"
sys.exit(code)
"""


def test_cli_arrow_engine_starts_no_jvm(spark, tmp_path):
    """``read`` and ``validate`` on the arrow engine (asked for, or picked by auto for a small
    table) import no pyspark and cannot start a JVM: there is no Java to start."""
    import os

    t = make_table(spark, tmp_path)
    add_index_delta(t, bucket_of_key(t, "k11"), ["k11"], [None])
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java"), "SPARK_HOME": str(tmp_path / "no-spark"),
           "PATH": os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                   if not os.path.exists(os.path.join(p, "java")))}
    env.pop("SPARK_REMOTE", None)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", _NO_SPARK, *args], capture_output=True, text=True,
                              timeout=120, env=env)

    p = cli("validate", t.uri, "--engine", "arrow")
    assert p.returncode == 1, p.stderr
    assert '"keys_missing_from_index"' in p.stdout and "k11" in p.stdout
    assert p.stderr.strip().splitlines()[-1] == "bucketindex: validate found problems: keys_missing_from_index"
    assert "engine: arrow (--engine arrow)" in p.stderr
    p = cli("read", t.uri, "--limit", "3")
    assert p.returncode == 0, p.stderr
    assert "engine: arrow (needs about" in p.stderr
    lines = p.stdout.splitlines()
    assert lines[1].replace(" ", "") == "|id|region|ts|" and len(lines) == 8
    assert lines[-1] == "only showing top 3 rows"
    out = tmp_path / "snap.parquet"
    p = cli("read", t.uri, "--engine", "arrow", "--output", str(out))
    assert p.returncode == 0, p.stderr
    assert pq.read_table(out).num_rows == 40
    p = cli("read", t.uri, "--engine", "arrow", "--master", "local[1]")
    assert p.returncode == 2 and "--engine arrow runs in-process; --master local[1] asks for Spark" in p.stderr


def test_cli_read_auto_over_budget_writes_on_spark(spark, tmp_path):
    """``read --output`` with ``--engine auto`` and a budget the snapshot does not fit: Spark reads
    it and writes the one Parquet file (the snapshot is never held in memory)."""
    import os

    from spark_jobs.table.reader import read_arrow

    t = make_table(spark, tmp_path)
    out = tmp_path / "snap.parquet"
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    p = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "read", t.uri, "--output", str(out),
                        "--memory-budget", "1k"], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert "engine: spark (needs about" in p.stderr and "over the 1 KiB budget" in p.stderr
    assert p.stdout.strip() == f"wrote 40 rows to {out}"
    key = lambda r: r["id"]  # noqa: E731
    assert sorted(pq.read_table(out).to_pylist(), key=key) == sorted(read_arrow(t.uri).to_pylist(), key=key)
    assert sorted(os.listdir(tmp_path)) == sorted(["b.parquet", "snap.parquet", "t"])  # no temp directory left


def _flip_in_last_page(uri: str, column: str) -> str:
    """Flip a byte inside ``column``'s last page of the first row group of the table's first
    slice (a damaged page, issue 36 item 3); the file's path."""
    t = Table.load(uri)
    path = t.abs(t.view().slices()[0].path)
    group = pq.ParquetFile(path).metadata.row_group(0)
    col = next(group.column(i) for i in range(group.num_columns) if group.column(i).path_in_schema == column)
    data = bytearray(open(path, "rb").read())
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    data[start + col.total_compressed_size - 20] ^= 0x5A
    open(path, "wb").write(bytes(data))
    return path


def test_damaged_page_is_named_by_spark_validate(spark, tmp_path):
    """A flipped byte in a data page (issue 36 item 3): Spark's validate reads every file whole
    (page checksums verified, in tasks) and names it."""
    import random

    from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert

    rng = random.Random(3)
    rows = [{"id": f"k {i}/%+é", "region": ["eu west/1", "", None][i % 3], "ts": i, "v": rng.random(),
             "name": rng.choice(["alice", "bob", "dañ+%"])} for i in range(600)]
    uri = str(tmp_path / "t")
    arrow_upsert(UpsertOptions(table=uri, source=write_batch(tmp_path / "b.parquet", rows), record_key=["id"],
                               precombine_field="ts", partition_field="region"))
    path = _flip_in_last_page(uri, "v")
    report = run_validate(spark, uri)
    assert not report["ok"] and list(report["problems"]) == ["damaged_files"], report
    assert report["problems"]["damaged_files"]["samples"][0].startswith(f"{path}: ")


def test_a_damaged_page_fails_a_spark_read_naming_the_file(spark, tmp_path, capsys):
    """Spark's own Parquet scan of a plain slice verifies page checksums too (the session's
    ``parquet.page.verify-checksum.enabled``): a flipped byte is exit 1 naming the file, never
    other values (issue 36 item 3)."""
    import random

    from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
    from spark_jobs.cli import main

    rng = random.Random(5)
    rows = [{"id": f"k {i}/%+é", "region": "eu west/1", "ts": i, "v": rng.randint(0, 10**6)} for i in range(5000)]
    uri = str(tmp_path / "t")
    arrow_upsert(UpsertOptions(table=uri, source=write_batch(tmp_path / "b.parquet", rows), record_key=["id"],
                               precombine_field="ts", partition_field="region"))
    path = _flip_in_last_page(uri, "v")
    capsys.readouterr()
    out = tmp_path / "snap.parquet"
    assert main(["read", uri, "--engine", "spark", "--output", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and path in err[0] and "damaged" in err[0], err
    assert not out.exists()
