"""Re-running a past date of the ingest DAG (issue 40, "a new user's surprises"): the upsert's batch
id is its data interval's, not its run's, so ``dag.test`` of 2024-03-01 after 2024-03-02 -- a new
run, with a new run id -- finds the first day's batch committed, does nothing and says so; the
second day's delete stays. ``replay=True`` applies the batch again on purpose, under a new id.

Through ``dag.test()`` on the in-process Arrow engine (no Spark); keys with spaces, ``/``, ``%``,
non-ASCII; a null value."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(300)]

INGEST = "bucketindex_ingest"
D1, D2 = (datetime(2024, 3, d, tzinfo=timezone.utc) for d in (1, 2))
SCHEMA = pa.schema([("id", pa.string()), ("v", pa.float64()), ("ts", pa.int64()), ("is_deleted", pa.bool_())])


def _write(folder, rows) -> None:  # type: ignore[no-untyped-def]
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), str(folder / "part-0.parquet"))


def _live(table: str) -> dict[str, float | None]:
    from spark_jobs.api import Table

    rows = Table(table).read().to_pylist()
    return {r["id"]: r["v"] for r in rows}


def _commits(table: str) -> list[str]:
    from spark_jobs.table import Action, Table

    tl = Table.load(table).timeline.reload()
    return [tl.read_metadata(i).get("batch_id") for i in tl.completed([Action.COMMIT])]


def test_rerunning_a_past_date_is_a_noop_and_replay_applies_it_again(tmp_path, airflow_db, capfd):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox

    landing, table = tmp_path / "landing é", str(tmp_path / "table 1%")
    _write(landing / "2024-03-01", [{"id": "a b", "v": 1.0, "ts": 1, "is_deleted": False},
                                    {"id": "x/y", "v": None, "ts": 1, "is_deleted": False},
                                    {"id": "ü%", "v": 3.0, "ts": 1, "is_deleted": False}])
    _write(landing / "2024-03-02", [{"id": "x/y", "v": None, "ts": 2, "is_deleted": True},
                                    {"id": "new+1", "v": 4.0, "ts": 2, "is_deleted": False}])
    conf = {"table_uri": table, "landing_uri": str(landing), "engine": "arrow"}
    day1 = sandbox.run_dag(sandbox.load_dag(INGEST), D1, conf)
    day2 = sandbox.run_dag(sandbox.load_dag(INGEST), D2, conf)
    assert day1.state == day2.state == "success"
    after_day2 = {"a b": 1.0, "ü%": 3.0, "new+1": 4.0}
    assert _live(table) == after_day2
    first = day1.batch_id("upsert")
    assert first == f"{INGEST}/upsert/2024-03-01T00:00:00+00:00"
    assert _commits(table) == [first, day2.batch_id("upsert")]

    capfd.readouterr()
    again = sandbox.run_dag(sandbox.load_dag(INGEST), D1, conf)  # `airflow dags test bucketindex_ingest 2024-03-01`
    assert again.state == "success" and again.run_id != day1.run_id
    assert again.xcom("upsert")["batch_id"] == first
    assert _commits(table) == [first, day2.batch_id("upsert")], "the re-run committed nothing"
    assert _live(table) == after_day2, "the second day's delete stays"
    out = "".join(capfd.readouterr())
    assert f"Batch {first} is already committed" in out and "replay=True applies it again" in out

    replay = sandbox.run_dag(sandbox.load_dag(INGEST), D1, {**conf, "replay": True})
    assert replay.state == "success"
    replayed = f"{first}/replay/{replay.run_id}"
    assert replay.xcom("upsert")["batch_id"] == replayed
    assert _commits(table) == [first, day2.batch_id("upsert"), replayed]
    assert _live(table) == {**after_day2, "x/y": None}, "replayed on purpose: the first day's row is back"
