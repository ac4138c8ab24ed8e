"""Dynamic task mapping end to end: an upsert mapped over three landing files (a mapped task
group, ``upsert >> rollback`` per file), real spark-submit, ``dag.test()``. The writer that
runs last is killed before its commit; the rollback of *that* instance -- found by its map
index -- removes its pending instant, the other two commit, and the table equals the oracle
of the two committed files. (The last to run, not a fixed file: ``dag.test`` runs mapped
instances in no fixed order -- CI once ran map index 1 first -- and an upsert that starts
after a dead writer rolls back its abandoned instant itself, the core's own safety net,
before the rollback task gets to it.)"""

from __future__ import annotations

import pyarrow as pa
import pytest

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(600)]

DAG_ID = "bucketindex_test_mapped"


def test_mapped_upsert_rolls_back_only_the_failed_instance(tmp_path, airflow_db):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox
    from airflow_provider_bucketindex.demo import sample_data
    from spark_jobs.table import Action, Table

    (rows,) = sample_data.make_batches(1, 60, seed=5)
    keys = sorted(set(rows.column("id").to_pylist()))
    files = []
    for i, part in enumerate((keys[:20], keys[20:40], keys[40:])):  # disjoint keys: order cannot matter
        batch = rows.filter(pa.compute.is_in(rows.column("id"), pa.array(part)))
        sample_data.write_batch(batch, str(tmp_path / "landing" / f"file-{i}"))
        files.append(batch)
    table = str(tmp_path / "table")

    run = sandbox.run_dag(sandbox.load_dag(DAG_ID), conf={
        "table_uri": table, "landing_uri": str(tmp_path / "landing")})

    assert run.state == "failed", run  # the failed instance stays visible
    states = run.mapped_states("ingest_file.upsert")
    assert sorted(states.values()) == ["failed", "success", "success"], states
    (dead,) = [i for i, s in states.items() if s == "failed"]
    ok = sorted(i for i in states if i != dead)
    assert run.mapped_states("ingest_file.rollback") == {i: "success" if i == dead else "skipped" for i in states}
    assert run.mapped_states("ingest_file.committed") == {
        i: "upstream_failed" if i == dead else "success" for i in states}
    rolled = run.xcom("ingest_file.rollback", map_index=dead)
    def batch(i: int) -> str:  # the instance's id: map index i reads landing/file-<i> (sorted names)
        return run.batch_id("ingest_file.upsert", i, source=str(tmp_path / "landing" / f"file-{i}"))

    assert rolled["batch_id"] == batch(dead)
    assert rolled["rolled_back"], "the killed writer left a pending instant; its own rollback removes it"

    tl = Table.load(table).timeline.reload()
    assert tl.pending() == []
    batch_ids = sorted(tl.read_metadata(i)["batch_id"] for i in tl.completed([Action.COMMIT]))
    assert batch_ids == sorted(batch(i) for i in ok)
    assert all(b.startswith(f"{DAG_ID}/{run.run_id}/ingest_file.upsert/{i}/src-") for b, i in zip(batch_ids, ok))
    assert [tl.read_metadata(i)["rolled_back"] for i in tl.completed([Action.ROLLBACK])] == [rolled["rolled_back"]]
    assert sample_data.compare(table, [files[i] for i in ok]) == []
    # the instances are forced to engine="spark" (their fault kills spark-submit): they say so
    assert {run.xcom("ingest_file.upsert", map_index=i)["engine"] for i in ok} == {"spark"}
