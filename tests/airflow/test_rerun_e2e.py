"""Re-running a past date of the ingest DAG (issue 40, "a new user's surprises"): the upsert's batch
id is its data interval's and its source's, not its run's, so ``dag.test`` of 2024-03-01 after
2024-03-02 -- a new run, with a new run id -- finds the first day's batch committed, does nothing
and says so; the second day's delete stays. The same date read from another landing folder is
another batch and is applied; ``replay=True`` applies the batch again on purpose, under a new id.
A table whose commit carries the earlier form of the id (the interval alone, before ids named
their source) sees the re-run as a no-op too, and the log says which id it found.

Through ``dag.test()`` on the in-process Arrow engine (no Spark); keys with spaces, ``/``, ``%``,
``+``, non-ASCII; a null value; landing folders with a space, ``%``, ``+`` and non-ASCII."""

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
    from airflow_provider_bucketindex.batch import source_suffix
    from airflow_provider_bucketindex.demo import sandbox

    landing, table = tmp_path / "landing é", str(tmp_path / "table 1%")
    _write(landing / "2024-03-01", DAY1)
    _write(landing / "2024-03-02", [{"id": "x/y", "v": None, "ts": 2, "is_deleted": True},
                                    {"id": "new+1", "v": 4.0, "ts": 2, "is_deleted": False}])
    conf = {"table_uri": table, "landing_uri": str(landing), "engine": "arrow"}
    day1 = sandbox.run_dag(sandbox.load_dag(INGEST), D1, conf)
    day2 = sandbox.run_dag(sandbox.load_dag(INGEST), D2, conf)
    assert day1.state == day2.state == "success"
    after_day2 = {"a b": 1.0, "ü%": 3.0, "new+1": 4.0}
    assert _live(table) == after_day2
    source1 = f"{landing}/2024-03-01"  # the rendered {{ params.landing_uri }}/{{ ds }}
    first = day1.batch_id("upsert", source=source1)
    assert first == f"{INGEST}/upsert/2024-03-01T00:00:00+00:00" + source_suffix(source1)
    assert first.rsplit("/", 1)[1].startswith("src-")
    second = day2.batch_id("upsert", source=f"{landing}/2024-03-02")
    assert _commits(table) == [first, second]

    capfd.readouterr()
    again = sandbox.run_dag(sandbox.load_dag(INGEST), D1, conf)  # `airflow dags test bucketindex_ingest 2024-03-01`
    assert again.state == "success" and again.run_id != day1.run_id
    assert again.xcom("upsert")["batch_id"] == first
    assert _commits(table) == [first, second], "the re-run committed nothing"
    assert _live(table) == after_day2, "the second day's delete stays"
    out = "".join(capfd.readouterr())
    assert f"Batch {first} is already committed" in out and "replay=True applies it again" in out

    # the same date from another landing folder: another batch, applied
    corrected = tmp_path / "corrected+50% ü"
    _write(corrected / "2024-03-01", [{"id": "a b", "v": 7.0, "ts": 3, "is_deleted": False}])
    other = sandbox.run_dag(sandbox.load_dag(INGEST), D1, {**conf, "landing_uri": str(corrected)})
    assert other.state == "success"
    moved = other.batch_id("upsert", source=f"{corrected}/2024-03-01")
    assert other.xcom("upsert")["batch_id"] == moved != first
    assert _commits(table) == [first, second, moved]
    assert _live(table) == {**after_day2, "a b": 7.0}

    replay = sandbox.run_dag(sandbox.load_dag(INGEST), D1, {**conf, "replay": True})
    assert replay.state == "success"
    replayed = f"{first}/replay/{replay.run_id}"
    assert replay.xcom("upsert")["batch_id"] == replayed
    assert _commits(table) == [first, second, moved, replayed]
    # replayed on purpose: the first day's rows are back ("a b" keeps ts 3's value: its ts 1 row is older)
    assert _live(table) == {**after_day2, "a b": 7.0, "x/y": None}


DAY1 = [{"id": "a b", "v": 1.0, "ts": 1, "is_deleted": False},
        {"id": "x/y", "v": None, "ts": 1, "is_deleted": False},
        {"id": "ü%", "v": 3.0, "ts": 1, "is_deleted": False}]


def test_a_table_committed_under_the_earlier_form_of_the_id_sees_a_rerun_as_a_noop(tmp_path, airflow_db, capfd):  # type: ignore[no-untyped-def]
    """A table whose day-1 commit carries ``<dag>/<task>/<interval>`` -- the id before batch ids
    named their source -- and a later delete: re-running the date commits nothing and says which id
    it found; ``replay=True`` still applies it."""
    from airflow_provider_bucketindex.batch import source_suffix
    from airflow_provider_bucketindex.demo import sandbox
    from spark_jobs.api import Table as ApiTable

    landing, table = tmp_path / "landing é", str(tmp_path / "old table+1")
    _write(landing / "2024-03-01", DAY1)
    legacy = f"{INGEST}/upsert/2024-03-01T00:00:00+00:00"
    t = ApiTable.create(table, str(landing / "2024-03-01"), record_key="id", precombine_field="ts",
                        delete_field="is_deleted", batch_id=legacy)
    t.delete(["x/y"], precombine=2)
    commits = _commits(table)
    assert len(commits) == 2 and commits[0] == legacy and _live(table) == {"a b": 1.0, "ü%": 3.0}

    capfd.readouterr()
    conf = {"table_uri": table, "landing_uri": str(landing), "engine": "arrow"}
    again = sandbox.run_dag(sandbox.load_dag(INGEST), D1, conf)
    assert again.state == "success"
    new_form = legacy + source_suffix(f"{landing}/2024-03-01")
    assert again.xcom("upsert")["batch_id"] == legacy, "the summary is the commit it found"
    assert len(_commits(table)) == 2 and _live(table) == {"a b": 1.0, "ü%": 3.0}, "nothing applied again"
    out = "".join(capfd.readouterr())
    assert f"Batch {new_form} is already committed" in out and f"under the earlier form of its id, {legacy}" in out

    replay = sandbox.run_dag(sandbox.load_dag(INGEST), D1, {**conf, "replay": True})
    assert replay.state == "success"
    assert replay.xcom("upsert")["batch_id"] == f"{new_form}/replay/{replay.run_id}"
    assert len(_commits(table)) == 3 and _live(table) == {"a b": 1.0, "ü%": 3.0, "x/y": None}
