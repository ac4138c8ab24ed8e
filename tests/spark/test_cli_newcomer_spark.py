"""``rows_in_batch`` and ``keys_in_batch`` are the same figures on Spark as on the in-process engine.

The counts are set once, by the engine-neutral driver, from what each engine's prepare phase
reports (rows read before dedupe, identities after it): one small history with in-batch
duplicates, a stale update and a delete, written by each engine into its own table; the commits'
counts and the snapshots must agree, and equal the oracle. Also: the table's key, partition and
precombine field are read from ``table.json`` on Spark too (the second batch names none).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert as run_arrow
from spark_jobs.jobs.upsert import run_upsert as run_spark
from spark_jobs.table.action.upsert import UpsertOptions
from tests.unit.test_cli_newcomer import _write, commits, oracle, rows_1, rows_2, snapshot

pytestmark = pytest.mark.spark


def test_rows_and_keys_in_batch_agree_between_the_engines(spark, tmp_path: Path):
    b1 = _write(tmp_path / "b1.parquet", rows_1())
    b2 = _write(tmp_path / "b2.parquet", rows_2())
    counts = {}
    for name, run in (("arrow", run_arrow), ("spark", lambda o: run_spark(spark, o))):
        uri = str(tmp_path / name)
        # copy-on-write: every stale row is counted (tests/unit/test_cli_newcomer.py)
        run(UpsertOptions(table=uri, source=b1, record_key=["id"], precombine_field="ts", partition_field="region",
                          delete_field="is_deleted", batch_id="b1", table_type="copy_on_write"))
        out = run(UpsertOptions(table=uri, source=b2, delete_field="is_deleted", batch_id="b2"))
        assert out["counts"]["rows_in_batch"] == 5 and out["counts"]["keys_in_batch"] == 4, (name, out["counts"])
        assert out["ignored"] == {"stale_upserts": 1, "stale_or_absent_deletes": 0}, (name, out)  # Zoë's stale row
        assert snapshot(uri) == oracle(rows_1(), rows_2()), name
        counts[name] = [c["counts"] for c in commits(uri)]
    assert counts["arrow"] == counts["spark"]


def test_the_delete_field_reads_the_same_on_both_engines(spark, tmp_path: Path):
    """The help's --delete-field promise, on Spark as on Arrow: boolean strings and integers delete,
    and a string that is not a boolean is refused with the same line (exit 2), not an ANSI cast error."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_jobs.exceptions import BadInputError
    from tests.unit.test_cli_newcomer import DELETE_VALUES, delete_batch

    base = tmp_path / "base.parquet"
    keys = ["a b", "c/d", "50%+", "Zoë", "e€"]
    pq.write_table(pa.table({"id": keys, "v": [0] * 5}), base)
    for i, (kind, values, deletes) in enumerate(DELETE_VALUES[:2]):
        src = delete_batch(tmp_path, f"b{i}", kind, values)
        for name, run in (("arrow", run_arrow), ("spark", lambda o: run_spark(spark, o))):
            uri = str(tmp_path / f"{name}{i}")
            run(UpsertOptions(table=uri, source=str(base), record_key=["id"], batch_id="base"))
            out = run(UpsertOptions(table=uri, source=src, delete_field="flag", batch_id="b"))
            assert out["counts"]["deleted"] == sum(deletes), (name, kind)
        assert snapshot_ids(tmp_path / f"arrow{i}") == snapshot_ids(tmp_path / f"spark{i}") == sorted(
            k for k, d in zip(keys, deletes) if not d)
    bad = delete_batch(tmp_path, "bad", pa.string(), ["yes", "nope", None, "maybe", "0"])
    messages = []
    for run in (run_arrow, lambda o: run_spark(spark, o)):
        with pytest.raises(BadInputError) as e:
            run(UpsertOptions(table=str(tmp_path / "arrow0"), source=bad, delete_field="flag", batch_id="bad"))
        messages.append(str(e.value))
    assert messages[0] == messages[1] == ("delete field 'flag' holds 'maybe', which is not a boolean "
                                          "(true/false, t/f, yes/no, y/n, 1/0)")


def snapshot_ids(uri: Path) -> list[str]:
    from spark_jobs.table.reader import read_arrow

    return sorted(r["id"] for r in read_arrow(str(uri)).to_pylist())
