"""``shadow-compare`` in-process (``--engine arrow``): a healthy table reports nothing, every planted
fault is exactly one mismatch of the kind and with the sample the Spark job reports
(tests/spark/test_shadow_compare.py plants the same faults; tests/spark/test_shadow_compare_engines.py
holds both engines to equal reports), ``--since`` and ``--sample-fraction`` narrow the keys alike,
and the CLI runs it without Java or ``pyspark``.

Tables are written by the Arrow upsert: one record and one bucket table per module (inserts,
then updates and a delete); a test that plants a fault works on a copy.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.shadow_compare import needed_bytes, run_shadow_compare
from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.cli import main
from spark_jobs.index.hashing import bucket_of
from spark_jobs.index.record_index import IndexEntries, write_index_file
from spark_jobs.table.action.engine import choose_engine
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.shadow import (
    KINDS,
    ShadowOptions,
    fingerprint_label,
    in_sample,
    touched_since,
)
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action
from tests.unit.test_arrow_engine import NO_PYSPARK, _no_java_env

pytestmark = pytest.mark.unit

REGIONS = ["eu west/1", "us %2F+east", "亚太 ap"]
KEYS = [f"k{i:02d}" + (" /%+ключ" if i % 7 == 3 else "") for i in range(24)]
REGION_OF = {k: REGIONS[i % 3] for i, k in enumerate(KEYS)}
DELETED = KEYS[4]
UPDATED = KEYS[8:14]
SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.int64()), ("del", pa.bool_())])


def write_batch(path: Path, rows: list[dict]) -> str:
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return str(path)


def rows(keys, ts, deleted=()):
    return [{"id": k, "region": REGION_OF.get(k, REGIONS[0]), "ts": ts, "del": k in deleted} for k in keys]


def upsert(uri: str, src: str, index: str, table_type: str = "copy_on_write") -> None:
    run_upsert(UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts",
                             partition_field="region", index=index, num_buckets=2 if index == "bucket" else 4,
                             delete_field="del", table_type=table_type,
                             # merge-on-read: the logs are kept, so the comparison reads through them
                             auto_compact="off" if table_type == "merge_on_read" else None))


def build(base: Path, index: str, table_type: str = "copy_on_write") -> str:
    """Inserts, then updates and a delete (what tests/spark/test_shadow_compare.py builds with Spark)."""
    uri = str(base / index)
    upsert(uri, write_batch(base / f"{index}-1.parquet", rows(KEYS, 1)), index, table_type)
    upsert(uri, write_batch(base / f"{index}-2.parquet", rows([*UPDATED, DELETED], 2, [DELETED])), index, table_type)
    return uri


def tamper_commit(t: Table, metadata: dict) -> None:
    inst = t.timeline.transition_to_inflight(t.timeline.create_requested(Action.COMMIT, {"batch_id": "tamper"}))
    t.timeline.complete(inst, {"batch_id": "tamper", **metadata})


def add_index_delta(t: Table, bucket: int, keys: list[str], targets: list) -> None:
    """An index delta committed on its own: entries (or tombstones, ``None``) for ``keys``."""
    path = t.layout.index_file(bucket, "delta", "29990101000000000")
    write_index_file(t.io, path, IndexEntries.from_keys(keys, targets))
    tamper_commit(t, {"index": {"added": [{"bucket": bucket, "path": t.layout.rel(path), "kind": "delta"}]}})


def bucket_of_key(t: Table, key: str) -> int:
    return bucket_of(key, t.num_buckets())


def location(t: Table, key: str):
    for s in t.view().slices():
        if key in pq.read_table(t.abs(s.path), columns=["_bi_key"]).column(0).to_pylist():
            return s
    raise AssertionError(key)


def only(report, kind, label):
    assert report[kind] == 1 and report["mismatches"] == 1, report
    assert report["samples"][kind] == [label], report
    assert not report["ok"]


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    base = tmp_path_factory.mktemp("shadow-arrow")
    return {index: build(base, index) for index in ("record", "bucket")}


@pytest.fixture
def record_copy(tables, tmp_path) -> Table:
    shutil.copytree(tables["record"], tmp_path / "t")
    return Table.load(str(tmp_path / "t"))


@pytest.mark.parametrize("index", ["record", "bucket"])
def test_healthy_tables_pass(tables, index):
    uri = tables[index]
    r = run_shadow_compare(uri)
    assert r["ok"] and r["mismatches"] == 0 and r["keys_checked"] == len(KEYS) - 1, r
    assert {r[k] for k in KINDS} == {0} and r["samples"] == {k: [] for k in KINDS}
    assert r["instant"] == Table.load(uri).timeline.max_instant()
    assert (r["table"], r["against"], r["since"], r["commits_since"]) == (uri, "scan", None, None)
    for against in (["global_simple", "bucket"] if index == "record" else ["global_simple"]):
        o = run_shadow_compare(uri, ShadowOptions(against=against))
        assert o["ok"] and o["keys_checked"] == len(KEYS) - 1, o
    first = Table.load(uri).timeline.completed()[0].timestamp
    s = run_shadow_compare(uri, ShadowOptions(since=first))
    assert s["ok"] and s["commits_since"] == 1 and 0 < s["keys_checked"] <= len(KEYS), s


def test_merge_on_read_table_passes(tmp_path):
    uri = build(tmp_path, "record", "merge_on_read")
    assert any(s.logs for s in Table.load(uri).view().slices())
    r = run_shadow_compare(uri)
    assert r["ok"] and r["keys_checked"] == len(KEYS) - 1, r
    first = Table.load(uri).timeline.completed()[0].timestamp
    s = run_shadow_compare(uri, ShadowOptions(since=first))
    # the logs of the second commit hold its keys: the updates, and the delete (neither a row nor an entry now)
    assert s["ok"] and s["keys_checked"] == len(UPDATED), s


def test_index_entry_pointing_at_the_wrong_file_group(record_copy):
    t, key = record_copy, KEYS[5]
    add_index_delta(t, bucket_of_key(t, key), [key], [(location(t, key).partition, "no-such-file-group")])
    only(run_shadow_compare(t.uri), "wrong_location", key)
    # against a bucket index only the partition is compared: the same partition is no mismatch
    assert run_shadow_compare(t.uri, ShadowOptions(against="bucket"))["ok"]


def test_index_entry_in_another_partition_is_a_wrong_location_also_against_bucket(record_copy):
    t, key = record_copy, KEYS[6]
    other = next(r for r in REGIONS if r != REGION_OF[key])
    add_index_delta(t, bucket_of_key(t, key), [key], [(f"region={other}", location(t, key).file_id)])
    only(run_shadow_compare(t.uri, ShadowOptions(against="bucket")), "wrong_location", key)


def test_missing_index_entry(record_copy):
    t, key = record_copy, KEYS[7]
    add_index_delta(t, bucket_of_key(t, key), [key], [None])  # a tombstone for a live key
    only(run_shadow_compare(t.uri), "missing", key)
    assert run_shadow_compare(t.uri, ShadowOptions(max_mismatches=1))["ok"]


def test_entry_in_the_wrong_bucket_is_missing_and_extra(record_copy):
    """A lookup reads the bucket the key hashes to: an entry elsewhere is invisible there."""
    t, key = record_copy, KEYS[15]
    s = location(t, key)
    right = bucket_of_key(t, key)
    add_index_delta(t, right, [key], [None])
    add_index_delta(t, (right + 1) % t.num_buckets(), [key], [(s.partition, s.file_id)])
    r = run_shadow_compare(t.uri, ShadowOptions(max_mismatches=2))
    assert (r["missing"], r["extra"], r["mismatches"], r["ok"]) == (1, 1, 2, True), r
    assert r["samples"]["missing"] == [key] and r["samples"]["extra"] == [fingerprint_label(key)]
    assert r["keys_checked"] == len(KEYS)  # the key's rows and the stray entry: two rows of the join


def test_extra_entry_for_a_deleted_key(record_copy):
    t = record_copy
    s = t.view().slices()[0]
    add_index_delta(t, bucket_of_key(t, DELETED), [DELETED], [(s.partition, s.file_id)])
    only(run_shadow_compare(t.uri), "extra", fingerprint_label(DELETED))
    # --since reads the version the delete replaced: the entry is named by its key
    first = t.timeline.completed()[0].timestamp
    r = run_shadow_compare(t.uri, ShadowOptions(since=first))
    assert r["extra"] == 1 and r["samples"]["extra"] == [DELETED], r


def test_duplicated_key_in_the_data(record_copy):
    t, key = record_copy, KEYS[9]
    s = location(t, key)
    data = pq.read_table(t.abs(s.path))
    pq.write_table(pa.concat_tables([data, data.filter(pc.equal(data.column("_bi_key"), key))]), t.abs(s.path))
    only(run_shadow_compare(t.uri), "duplicated", key)


def test_bucket_table_row_in_the_wrong_bucket(tables, tmp_path):
    shutil.copytree(tables["bucket"], tmp_path / "t")
    t = Table.load(str(tmp_path / "t"))
    s = t.view().slices()[0]
    stray = next(k for k in (f"stray{i}" for i in range(100)) if f"{bucket_of_key(t, k):08d}" != s.file_id)
    data = pq.read_table(t.abs(s.path))
    row = data.slice(0, 1).to_pylist()[0] | {"_bi_key": stray, "id": stray}
    pq.write_table(pa.concat_tables([data, pa.Table.from_pylist([row], schema=data.schema)]), t.abs(s.path))
    only(run_shadow_compare(t.uri), "wrong_location", stray)
    # the same key in two partitions: a duplicate only for a global index
    other = next(x for x in t.view().slices() if x.partition != s.partition)
    odata = pq.read_table(t.abs(other.path))
    key = odata.column("_bi_key")[0].as_py()
    row = data.slice(0, 1).to_pylist()[0] | {"_bi_key": key, "id": key}
    pq.write_table(pa.concat_tables([data, pa.Table.from_pylist([row], schema=data.schema)]), t.abs(s.path))
    r = run_shadow_compare(t.uri, ShadowOptions(against="global_simple", max_mismatches=9))
    assert r["duplicated"] == 1 and r["samples"]["duplicated"] == [key], r


def test_samples_are_the_smallest_keys(record_copy):
    t = record_copy
    gone = sorted(k for k in KEYS if k != DELETED)[:14]
    for b in {bucket_of_key(t, k) for k in gone}:  # a tombstone per key, in its bucket
        keys = [k for k in gone if bucket_of_key(t, k) == b]
        add_index_delta(t, b, keys, [None] * len(keys))
    r = run_shadow_compare(t.uri, ShadowOptions(max_mismatches=100))
    assert r["missing"] == 14 and r["samples"]["missing"] == gone[:10], r


def test_since_compares_only_keys_touched_after_the_instant(record_copy, tmp_path):
    t, key = record_copy, KEYS[10]
    before = t.timeline.max_instant()
    add_index_delta(t, bucket_of_key(t, key), [key], [None])
    fault = t.timeline.reload().max_instant()
    upsert(t.uri, write_batch(tmp_path / "b3.parquet", rows(["new1", "new2 é"], 3)), "record")
    r = run_shadow_compare(t.uri, ShadowOptions(since=fault))
    assert r["ok"] and r["mismatches"] == 0 and r["commits_since"] == 1, r
    assert 2 <= r["keys_checked"] < len(KEYS) + 1, r
    only(run_shadow_compare(t.uri, ShadowOptions(since=before)), "missing", key)
    only(run_shadow_compare(t.uri), "missing", key)
    # --engine auto sizes a --since by the keys the commits after it touched, not by the table
    t = Table.load(t.uri)
    touched = touched_since(t, fault)
    assert touched.rows >= 2 and touched.data_files and touched.actions == 1
    since = needed_bytes(t, t.view(), ShadowOptions(since=fault), touched)
    more = dataclasses.replace(touched, rows=touched.rows + 10**6)
    assert 0 < since < needed_bytes(t, t.view(), ShadowOptions(since=fault), more)
    big = t.view()
    big.file_groups = {k: dataclasses.replace(v, num_rows=10**6, size=10**7) for k, v in big.file_groups.items()}
    assert needed_bytes(t, big, ShadowOptions(since=fault), touched) < needed_bytes(t, big)


def test_sample_fraction_is_deterministic(record_copy):
    t, key = record_copy, KEYS[11]
    add_index_delta(t, bucket_of_key(t, key), [key], [None])
    runs = [run_shadow_compare(t.uri, ShadowOptions(sample_fraction=0.5, max_mismatches=5)) for _ in range(2)]
    expected = sum(in_sample(k, 0.5) for k in KEYS if k != DELETED)
    assert runs[0]["keys_checked"] == runs[1]["keys_checked"] == expected and 0 < expected < len(KEYS) - 1
    assert runs[0]["missing"] == int(in_sample(key, 0.5)) and runs[0]["ok"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_PYSPARK, "shadow-compare", *args], check=False,
                          capture_output=True, text=True, timeout=120, env=_no_java_env())


def test_cli_runs_in_process_without_java_or_pyspark(record_copy, tmp_path):
    t, key = record_copy, KEYS[7]
    dest = tmp_path / "out" / "report.json"
    p = _cli(t.uri, "--engine", "arrow", "--report", str(dest))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "engine: arrow (--engine arrow)" in p.stderr
    assert json.loads(p.stdout) == json.loads(dest.read_text()) and json.loads(p.stdout)["ok"]
    add_index_delta(t, bucket_of_key(t, key), [key], [None])
    p = _cli(t.uri, "--since", t.timeline.completed()[0].timestamp)  # auto: a small table runs here
    assert p.returncode == 1 and "engine: arrow (needs about" in p.stderr, p.stderr[-3000:]
    assert p.stderr.strip().splitlines()[-1].endswith("found 1 mismatch (more than 0): missing 1")
    assert json.loads(p.stdout)["samples"]["missing"] == [key]
    p = _cli(t.uri, "--engine", "arrow", "--master", "local[1]")
    assert p.returncode == 2 and "asks for Spark" in p.stderr


def test_auto_picks_spark_over_the_budget(tables, capsys, caplog, monkeypatch):
    """Over the budget, auto runs the Spark job (stubbed here, without pyspark: the choice is the subject)."""
    import types

    from spark_jobs import cli

    calls = []
    monkeypatch.setattr(cli, "_spark", lambda args, submitted: calls.append(args) or "session")
    job = types.ModuleType("spark_jobs.jobs.shadow_compare")
    job.run_shadow_compare = lambda spark, uri, opts: run_shadow_compare(uri, opts)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "spark_jobs.jobs.shadow_compare", job)
    with caplog.at_level("INFO", logger="bucketindex.engine"):
        assert main(["shadow-compare", tables["record"], "--memory-budget", "1k"]) == 0
    assert calls and any("over the" in r.getMessage() for r in caplog.records)
    assert main(["shadow-compare", tables["record"], "--memory-budget", "lots"]) == 2
    assert "memory budget" in capsys.readouterr().err
    small = choose_engine(requested="auto", needed_bytes=needed_bytes(Table.load(tables["record"]),
                                                                      Table.load(tables["record"]).view()),
                          budget=1 << 30)
    assert small.engine == "arrow"
