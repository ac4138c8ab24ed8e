"""The packaged TaskFlow example ``bucketindex_taskflow_ingest`` (``@task.bucketindex_upsert``)
through ``dag.test()``: two days' landing batches, cleaned by the function (keyless rows dropped,
keys trimmed) and upserted in the task; the table equals the oracle of the cleaned batches
(``tests/oracle.py``), the ``report`` task reads it back through ``BucketIndexHook.get_df``, and a
re-run of the first day commits nothing. Keys with spaces, ``/``, ``%``, ``+``, non-ASCII; nulls;
an in-batch duplicate; a stale update; a delete."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.oracle import reduce_batches

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(300)]

DAG_ID = "bucketindex_taskflow_ingest"
D1, D2 = (datetime(2024, 3, d, tzinfo=timezone.utc) for d in (1, 2))
SCHEMA = pa.schema([("id", pa.string()), ("v", pa.float64()), ("ts", pa.int64()), ("is_deleted", pa.bool_())])


def _row(key, v, ts, deleted=False):  # type: ignore[no-untyped-def]
    return {"id": key, "v": v, "ts": ts, "is_deleted": deleted}


DAY1 = [_row(" a b ", 1.0, 1), _row("x/y", None, 1), _row("p%q", 3.0, 1), _row("m+n", 4.0, 1),
        _row("ünï", 5.0, 1), _row(None, 9.0, 1), _row("  ", 9.0, 1)]
DAY2 = [_row("a b", 10.0, 3), _row("a b", 99.0, 2),  # in-batch duplicate: ts 3 wins
        _row("p%q", 77.0, 0),  # stale: the stored row stays
        _row("m+n", None, 2, True),  # deleted
        _row("new ü/1", None, 2), _row(None, 1.0, 2)]


def _clean(rows):  # type: ignore[no-untyped-def]
    """What the example's function keeps: keyed rows, keys trimmed."""
    out = [{**r, "id": r["id"].strip()} for r in rows if r["id"] is not None]
    return [r for r in out if r["id"]]


def _write(folder, rows) -> None:  # type: ignore[no-untyped-def]
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), str(folder / "part 0.parquet"))


def _table(table: str) -> dict[str, dict]:  # type: ignore[type-arg]
    from spark_jobs.api import Table

    return {r["id"]: {k: r[k] for k in ("id", "v", "ts")} for r in Table(table).read().to_pylist()}


def test_taskflow_example_upserts_the_cleaned_batches(tmp_path, airflow_db):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox

    landing, table = tmp_path / "landing é", str(tmp_path / "events 1%")
    _write(landing / "2024-03-01", DAY1)
    _write(landing / "2024-03-02", DAY2)
    conf = {"table_uri": table, "landing_uri": str(landing)}
    day1 = sandbox.run_dag(sandbox.load_dag(DAG_ID), D1, conf)
    assert day1.state == "success", day1
    first_instant = day1.xcom("clean_batch")["instant"]  # read now: dag.test of D1 again replaces this run
    assert day1.xcom("report") == {"rows": 5, "instant": first_instant,
                                   "batch_id": f"{DAG_ID}/clean_batch/2024-03-01T00:00:00+00:00",
                                   "inserted": 5, "updated": 0, "deleted": 0}
    day2 = sandbox.run_dag(sandbox.load_dag(DAG_ID), D2, conf)
    assert day2.state == "success", day2

    expected = reduce_batches([_clean(DAY1), _clean(DAY2)])
    want = {k: {c: r[c] for c in ("id", "v", "ts")} for k, r in expected.items()}
    assert _table(table) == want
    assert set(want) == {"a b", "x/y", "p%q", "ünï", "new ü/1"} and want["a b"]["v"] == 10.0
    assert day2.xcom("report")["rows"] == 5

    again = sandbox.run_dag(sandbox.load_dag(DAG_ID), D1, conf)  # a re-run of the first day: a no-op
    assert again.state == "success"
    assert again.xcom("clean_batch")["instant"] == first_instant
    assert _table(table) == want
