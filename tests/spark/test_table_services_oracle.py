"""The table services beside ingestion, against the oracle: random sequences of upserts (with
deletes, re-inserts after delete and partition moves), compaction schedules and executes (a
plan executed after further upserts), cleans and timeline checkpoints. After every step the
table equals the batches reduced by key; at the end ``validate`` passes, a read as of every
retained instant equals the oracle at that instant, and older ones fail clearly.

The subject is the protocol and the services: the upserts and ``validate`` run on the in-process
Arrow engine, the compactions (the service's execution) on Spark."""

from __future__ import annotations

import random

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.exceptions import BadInputError
from spark_jobs.jobs.compact import run_compact
from spark_jobs.table.action.clean import run_clean
from spark_jobs.table.action.compact import CompactionPolicy
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.config import TableConfig
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity
from tests.spark.conftest import write_batch
from tests.unit.test_arrow_oracle_upsert import _dedupe_ties, make_batches

pytestmark = pytest.mark.spark

#: partition values as users have them: spaces, '/', '%', '+', non-ASCII
ODD_REGIONS = {"eu": "eu west/1", "us": "us %2F+east", "ap": "亚太 ap"}
POLICY = CompactionPolicy(min_deltas=2, min_logs=2)


@pytest.mark.parametrize("seed", [7])
def test_random_services_beside_upserts_match_the_oracle(spark, tmp_path, seed):
    rnd = random.Random(seed)
    batches = make_batches(seed=seed, n_batches=9, pool=200, size=120)
    for rows in batches:
        for r in rows:
            r["region"] = ODD_REGIONS[r["region"]]
    _dedupe_ties(batches, False)
    uri = str(tmp_path / "t")
    # a checkpoint every 3 entries, so the run crosses several (the default is 10)
    Table.open(uri).create(TableConfig(record_key_fields=["id"], partition_fields=["region"],
                                       precombine_field="ts", index_type="record", num_buckets=4,
                                       table_type="merge_on_read", target_file_rows=80, checkpoint_interval=3))
    snapshots: list[tuple[str, dict]] = []  # (instant, oracle right after it)
    pending: list[tuple[str, int]] = []  # scheduled compactions and the batch count when planned
    done = {"schedule": 0, "execute": 0, "late_execute": 0, "clean": 0, "cleaned_files": 0}

    def expect(n: int) -> dict:
        return reduce_batches(batches[:n])

    for i, rows in enumerate(batches):
        res = run_upsert(UpsertOptions(
            table=uri, source=write_batch(tmp_path / f"b{i}.parquet", rows), record_key=["id"],
            precombine_field="ts", partition_field="region", delete_field="is_deleted", batch_id=f"b{i}"))
        snapshots.append((res["instant"], expect(i + 1)))
        assert rows_by_identity(read_arrow(uri).to_pylist()) == expect(i + 1)
        step = rnd.choice(["schedule", "execute", "clean", "none"]) if i < len(batches) - 1 else "execute"
        if i == 2:
            step = "schedule"  # at least one plan executed after further upserts
        if step == "schedule" or (step == "execute" and not pending):
            planned = run_compact(None, uri, policy=POLICY, schedule_only=True)
            if planned["instant"]:
                pending.append((planned["instant"], i + 1))
                done["schedule"] += 1
        if step == "execute" and pending:
            instant, planned_at = pending.pop(0)
            out = run_compact(spark, uri, instant=instant)
            assert out["executed"]
            snapshots.append((instant, expect(i + 1)))
            done["execute"] += 1
            done["late_execute"] += planned_at < i + 1
        if step == "clean":
            out = run_clean(uri, retain_commits=rnd.choice([2, 4]))
            done["clean"] += out["instant"] is not None
            done["cleaned_files"] += out["files"]
        assert rows_by_identity(read_arrow(uri).to_pylist()) == expect(i + 1)
    out = run_clean(uri, retain_commits=3)
    done["clean"] += out["instant"] is not None
    done["cleaned_files"] += out["files"]
    assert done["execute"] >= 1 and done["late_execute"] >= 1 and done["clean"] >= 1 and done["cleaned_files"] > 0, done

    table = Table.load(uri)
    assert table.timeline.base_seq > 0, "no timeline checkpoint was written"
    assert rows_by_identity(read_arrow(uri).to_pylist()) == expect(len(batches))
    assert run_validate(uri)["ok"]
    kept = table.retained_from()
    assert kept is not None
    checked = refused = 0
    for instant, state in snapshots:
        seq = table.timeline.find(instant).seq
        if seq >= kept["earliest_retained_seq"]:
            assert rows_by_identity(read_arrow(uri, instant).to_pylist()) == state, instant
            checked += 1
        else:
            with pytest.raises(BadInputError, match="older than the retained window"):
                read_arrow(uri, instant)
            refused += 1
    assert checked >= 3 and refused >= 1
