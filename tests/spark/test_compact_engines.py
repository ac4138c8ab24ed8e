"""Compaction on both engines: one table (copied) compacted by Spark and by the in-process Arrow
engine gets the same plan, the same snapshot, the same file-group layout and the same index;
both pass ``validate``."""

from __future__ import annotations

import posixpath
import random
import shutil

import pyarrow as pa
import pytest

from spark_jobs.arrow_engine.compact import run_compact as arrow_compact
from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.arrow_engine.validate import run_validate as arrow_validate
from spark_jobs.jobs.compact import run_compact as spark_compact
from spark_jobs.jobs.upsert import run_upsert as spark_upsert
from spark_jobs.table.action.compact import CompactionPolicy
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity
from tests.spark.conftest import write_batch

pytestmark = pytest.mark.spark

EVERYTHING = CompactionPolicy(min_logs=1, min_deltas=2)
SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.int64()), ("amount", pa.float64()),
                    ("is_deleted", pa.bool_())])


def _batches(seed: int, n: int = 3, pool: int = 120, size: int = 80) -> list[list[dict]]:
    rnd = random.Random(seed)
    regions = ["eu west/1", "sã%o+paulo", None]
    region_of = {k: rnd.choice(regions) for k in range(pool)}
    out = []
    for b in range(n):
        rows = []
        for j in range(size):
            k = rnd.randrange(pool)
            if rnd.random() < 0.15:
                region_of[k] = rnd.choice(regions)  # partition move
            ts = b * 1000 + j if rnd.random() > 0.1 else b * 1000 - 500 - j  # late events
            rows.append({"id": f"k{k:03d} /%+é", "region": region_of[k], "ts": ts, "amount": rnd.random(),
                         "is_deleted": rnd.random() < 0.12})
        out.append(rows)
    return out


def _plan(uri: str, instant: str) -> dict:
    t = Table.load(uri)
    plan = t.timeline.read_plan(t.timeline.find(instant))
    return {k: plan[k] for k in ("file_groups", "index_buckets", "snapshot_seq", "index_base_cap")}


def _layout(uri: str) -> tuple[dict, dict]:
    """File groups as (directory of the base, live rows, logs), index buckets as [(kind, entries)]:
    everything but the names, which carry each run's instant and attempt."""
    t = Table.load(uri)
    view = t.view()
    groups = {k: (posixpath.dirname(s.path), s.num_rows, len(s.logs)) for k, s in view.file_groups.items()}
    meta = t.timeline.read_metadata(t.timeline.completed(["compaction"])[-1])
    bases = {a["bucket"]: (a["entries"], a["sealed"]) for a in meta["index"]["added"]}
    index = {b: (len(files), bases.get(b)) for b, files in view.index_files.items()}
    return groups, index


def test_spark_and_arrow_compaction_give_the_same_table(spark, tmp_path):
    batches = _batches(seed=31)
    uri = str(tmp_path / "built")
    for i, rows in enumerate(batches):
        run_upsert(UpsertOptions(table=uri, source=write_batch(tmp_path / f"b{i}.parquet", rows, SCHEMA),
                                 record_key=["id"], precombine_field="ts", partition_field="region", index="record",
                                 num_buckets=4, delete_field="is_deleted", batch_id=f"b{i}", target_file_rows=40,
                                 table_type="merge_on_read"))
    on_spark, on_arrow = str(tmp_path / "spark"), str(tmp_path / "arrow")
    shutil.copytree(uri, on_spark)
    shutil.copytree(uri, on_arrow)
    before = read_arrow(uri).to_pylist()

    by_spark = spark_compact(spark, on_spark, policy=EVERYTHING)
    by_arrow = arrow_compact(on_arrow, policy=EVERYTHING)
    assert by_spark["executed"] and by_arrow["executed"]
    assert by_spark["engine"]["name"] == "spark" and by_arrow["engine"]["name"] == "arrow"
    assert by_spark["counts"] == by_arrow["counts"] and by_arrow["counts"]["index_buckets"] > 0
    assert _plan(on_spark, by_spark["instant"]) == _plan(on_arrow, by_arrow["instant"])

    key = [("id", "ascending")]
    assert read_arrow(on_spark).sort_by(key).equals(read_arrow(on_arrow).sort_by(key))
    assert rows_by_identity(read_arrow(on_arrow).to_pylist()) == rows_by_identity(before) == reduce_batches(batches)
    assert _layout(on_spark) == _layout(on_arrow)
    assert not any(s.logs for s in Table.load(on_arrow).view().file_groups.values())
    # the index both engines wrote answers every key of the snapshot (Spark's validate gives the
    # same report as Arrow's: tests/spark/test_engine_equivalence.py)
    assert arrow_validate(on_spark)["ok"] and arrow_validate(on_arrow)["ok"]
    for uri_, t in ((on_spark, by_spark), (on_arrow, by_arrow)):
        assert Table.load(uri_).timeline.pending() == [] and not Table.load(uri_).marked_files(t["instant"])


def test_both_engines_upsert_beside_a_group_compacted_to_nothing(spark, tmp_path):
    """A merge-on-read group whose every row was deleted compacts to an empty base (kept for
    later logs). The next batch, tagged by global_simple against every live key, must give the
    same table on either engine: the Arrow engine failed there until 64a5a9e (the torture run,
    seed 1128; tests/unit/test_torture_regressions.py)."""
    uri = str(tmp_path / "t")
    first = [{"id": "k/1 %", "region": "日本", "ts": 5, "amount": 1.5, "is_deleted": False}]
    gone = [dict(first[0], ts=9, is_deleted=True)]
    later = [{"id": "k2", "region": "日本", "ts": 10, "amount": 2.5, "is_deleted": False},
             {"id": "ключ", "region": "é" * 110, "ts": 7, "amount": None, "is_deleted": False}]

    def opts(table: str, bid: str, rows: list[dict]) -> UpsertOptions:
        return UpsertOptions(table=table, source=write_batch(tmp_path / f"{bid}.parquet", rows, SCHEMA),
                             record_key=["id"], precombine_field="ts", partition_field="region",
                             index="global_simple", table_type="merge_on_read", delete_field="is_deleted",
                             batch_id=bid, auto_compact="off")  # the test compacts, once

    run_upsert(opts(uri, "b1", first))
    run_upsert(opts(uri, "b2", gone))
    assert arrow_compact(uri, policy=EVERYTHING)["executed"]
    assert [s.num_rows for s in Table.load(uri).view().file_groups.values()] == [0]
    on_spark, on_arrow = str(tmp_path / "spark"), str(tmp_path / "arrow")
    shutil.copytree(uri, on_spark)
    shutil.copytree(uri, on_arrow)
    spark_upsert(spark, opts(on_spark, "b3", later))
    run_upsert(opts(on_arrow, "b3", later))
    key = [("id", "ascending")]
    assert read_arrow(on_spark).sort_by(key).equals(read_arrow(on_arrow).sort_by(key))
    assert rows_by_identity(read_arrow(on_arrow).to_pylist()) == reduce_batches([first, gone, later])
    assert arrow_validate(on_spark)["ok"] and arrow_validate(on_arrow)["ok"]
