"""``shadow-compare`` finds every planted fault, each as exactly one mismatch naming its key,
and passes on healthy tables of both index types with odd partition values and keys.

One record table and one bucket table per module (two upserts each: inserts, then updates and
a delete); a test that plants a fault works on a copy.

``shadow-compare`` (on Spark) is the subject: the upserts that write the tables run on the
in-process Arrow engine. Its bad input needs no Spark: tests/unit/test_arrow_oracle_shadow_compare.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.cli import main
from spark_jobs.jobs.shadow_compare import run_shadow_compare
from spark_jobs.table.shadow import ShadowOptions, fingerprint_label, in_sample
from spark_jobs.table.table import Table
from tests.spark.conftest import tree_digest, write_batch
from tests.spark.test_validate import add_index_delta, bucket_of_key

# the tables' rows and the Arrow upsert that writes them
from tests.unit.test_arrow_oracle_shadow_compare import (  # noqa: F401
    DELETED,
    KEYS,
    REGION_OF,
    REGIONS,
    UPDATED,
    _rows,
    _upsert,
    make_tables,
)

pytestmark = pytest.mark.spark

@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    return make_tables(tmp_path_factory.mktemp("shadow"))


@pytest.fixture
def record_copy(tables, tmp_path) -> Table:
    shutil.copytree(tables["record"], tmp_path / "t")
    return Table.load(str(tmp_path / "t"))


def _location(t: Table, key: str):
    for s in t.view().slices():
        if key in pq.read_table(t.abs(s.path), columns=["_bi_key"]).column(0).to_pylist():
            return s
    raise AssertionError(key)


def _only(report, kind, key_label):
    assert report[kind] == 1 and report["mismatches"] == 1, report
    assert key_label in report["samples"][kind]
    assert not report["ok"]


def _cli(uri, *extra):
    return main(["shadow-compare", uri, *extra], submitted=True)


@pytest.mark.parametrize("index", ["record", "bucket"])
def test_healthy_tables_pass_with_odd_partitions(spark, tables, tmp_path, capsys, index):
    uri = tables[index]
    report = run_shadow_compare(spark, uri)
    live = len(KEYS) - 1
    assert report["ok"] and report["mismatches"] == 0 and report["keys_checked"] == live, report
    assert {report[k] for k in ("missing", "wrong_location", "extra", "duplicated")} == {0}
    assert report["instant"] == Table.load(uri).timeline.max_instant()
    assert (report["table"], report["against"], report["since"], report["sample_fraction"]) == (uri, "scan", None, 1.0)
    others = ["global_simple", "bucket"] if index == "record" else ["global_simple"]
    for against in others:
        r = run_shadow_compare(spark, uri, ShadowOptions(against=against))
        assert r["ok"] and r["mismatches"] == 0 and r["keys_checked"] == live, r
    capsys.readouterr()
    digest = tree_digest(Path(uri))
    dest = tmp_path / "out" / "report.json"
    assert _cli(uri, "--report", str(dest)) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(dest.read_text()) == printed and printed["ok"]
    assert tree_digest(Path(uri)) == digest  # reads only


def test_index_entry_pointing_at_the_wrong_file_group(spark, record_copy, capsys):
    t, key = record_copy, KEYS[5]
    s = _location(t, key)
    add_index_delta(t, bucket_of_key(t, key), [key], [(s.partition, "no-such-file-group")])
    _only(run_shadow_compare(spark, t.uri), "wrong_location", key)
    assert _cli(t.uri) == 1
    assert "wrong_location 1" in capsys.readouterr().err.strip().splitlines()[-1]
    assert _cli(t.uri, "--max-mismatches", "1") == 0


def test_index_entry_in_another_partition_is_a_wrong_location_also_against_bucket(spark, record_copy):
    t, key = record_copy, KEYS[6]
    other = next(r for r in REGIONS if r != REGION_OF[key])
    add_index_delta(t, bucket_of_key(t, key), [key], [(f"region={other}", _location(t, key).file_id)])
    _only(run_shadow_compare(spark, t.uri, ShadowOptions(against="bucket")), "wrong_location", key)


def test_missing_index_entry(spark, record_copy):
    t, key = record_copy, KEYS[7]
    add_index_delta(t, bucket_of_key(t, key), [key], [None])  # a tombstone for a live key
    _only(run_shadow_compare(spark, t.uri), "missing", key)
    assert _cli(t.uri) == 1
    assert _cli(t.uri, "--max-mismatches", "2") == 0


def test_extra_entry_for_a_deleted_key(spark, record_copy):
    t = record_copy
    s = t.view().slices()[0]
    add_index_delta(t, bucket_of_key(t, DELETED), [DELETED], [(s.partition, s.file_id)])
    _only(run_shadow_compare(spark, t.uri), "extra", fingerprint_label(DELETED))
    assert _cli(t.uri) == 1
    assert _cli(t.uri, "--max-mismatches", "1") == 0


def test_duplicated_key_in_the_data(spark, record_copy):
    t, key = record_copy, KEYS[9]
    s = _location(t, key)
    rows = pq.read_table(t.abs(s.path))
    again = rows.filter(pa.compute.equal(rows.column("_bi_key"), key))
    pq.write_table(pa.concat_tables([rows, again]), t.abs(s.path))
    _only(run_shadow_compare(spark, t.uri), "duplicated", key)
    assert _cli(t.uri) == 1
    assert _cli(t.uri, "--max-mismatches", "1") == 0


def test_bucket_table_row_in_the_wrong_bucket(spark, tables, tmp_path):
    shutil.copytree(tables["bucket"], tmp_path / "t")
    t = Table.load(str(tmp_path / "t"))
    s = t.view().slices()[0]
    stray = next(k for k in (f"stray{i}" for i in range(100)) if f"{bucket_of_key(t, k):08d}" != s.file_id)
    rows = pq.read_table(t.abs(s.path))
    row = rows.slice(0, 1).to_pylist()[0] | {"_bi_key": stray, "id": stray}
    pq.write_table(pa.concat_tables([rows, pa.Table.from_pylist([row], schema=rows.schema)]), t.abs(s.path))
    _only(run_shadow_compare(spark, t.uri), "wrong_location", stray)
    assert _cli(t.uri) == 1


def test_since_compares_only_keys_touched_after_the_instant(spark, record_copy, tmp_path):
    t, key = record_copy, KEYS[10]
    before = t.timeline.max_instant()
    add_index_delta(t, bucket_of_key(t, key), [key], [None])
    fault = t.timeline.reload().max_instant()
    later = ["new1", "new2 é"]
    _upsert(t.uri, write_batch(tmp_path / "b3.parquet", _rows(later, 3)), "record")
    r = run_shadow_compare(spark, t.uri, ShadowOptions(since=fault))
    # a copy-on-write commit rewrites whole file groups: their keys are all touched, the others are not
    assert r["ok"] and r["mismatches"] == 0 and r["commits_since"] == 1, r
    assert 2 <= r["keys_checked"] < len(KEYS) + 1, r
    _only(run_shadow_compare(spark, t.uri, ShadowOptions(since=before)), "missing", key)
    _only(run_shadow_compare(spark, t.uri), "missing", key)
    assert _cli(t.uri, "--since", fault) == 0
    assert _cli(t.uri, "--since", before) == 1


def test_since_checks_a_key_deleted_after_the_instant(spark, tables, tmp_path):
    """The deleted key is only in the file version the delete replaced: --since still checks it."""
    shutil.copytree(tables["record"], tmp_path / "t")
    t = Table.load(str(tmp_path / "t"))
    first = t.timeline.completed()[0].timestamp
    s = t.view().slices()[0]
    add_index_delta(t, bucket_of_key(t, DELETED), [DELETED], [(s.partition, s.file_id)])
    r = run_shadow_compare(spark, t.uri, ShadowOptions(since=first))
    assert r["extra"] == 1 and r["samples"]["extra"] == [DELETED], r  # named: the replaced version held it


def test_sample_fraction_is_deterministic(spark, record_copy):
    t, key = record_copy, KEYS[11]
    add_index_delta(t, bucket_of_key(t, key), [key], [None])
    runs = [run_shadow_compare(spark, t.uri, ShadowOptions(sample_fraction=0.5, max_mismatches=5)) for _ in range(2)]
    assert runs[0]["keys_checked"] == runs[1]["keys_checked"]
    expected = sum(in_sample(k, 0.5) for k in KEYS if k != DELETED)
    assert runs[0]["keys_checked"] == expected and 0 < expected < len(KEYS) - 1
    assert runs[0]["missing"] == int(in_sample(key, 0.5)) and runs[0]["ok"]


def test_since_after_compaction_and_clean_compares_what_is_left(spark, record_copy, capsys):
    """Issue 22: index compaction folds the deltas of the commits after ``--since`` into a base
    and clean deletes them; the comparison looks the touched keys up in the current index,
    counts what history can no longer tell (``history_unavailable``), and still finds a fault
    planted after the compaction."""
    from spark_jobs.jobs.compact import run_compact
    from spark_jobs.table.action.clean import run_clean
    from spark_jobs.table.action.compact import CompactionPolicy

    t = record_copy
    first = t.timeline.completed()[0].timestamp
    planned = run_compact(None, t.uri, policy=CompactionPolicy(min_deltas=2), schedule_only=True)
    assert planned["instant"], planned
    run_compact(spark, t.uri, instant=planned["instant"])
    assert run_clean(t.uri, retain_commits=1)["files"] > 0
    r = run_shadow_compare(spark, t.uri, ShadowOptions(since=first))
    assert r["ok"] and r["mismatches"] == 0, r
    assert r["history_unavailable"] > 0 and r["since_index_files_gone"] > 0, r  # the deltas clean deleted
    assert r["keys_checked"] >= len(UPDATED), r  # the updated keys, looked up in the compacted index
    assert _cli(t.uri, "--since", first) == 0
    capsys.readouterr()

    key = KEYS[12]
    add_index_delta(t, bucket_of_key(t, key), [key], [None])  # a tombstone for a live key
    _only(run_shadow_compare(spark, t.uri, ShadowOptions(since=first)), "missing", key)
    assert _cli(t.uri, "--since", first) == 1
