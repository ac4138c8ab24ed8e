"""Schema evolution on Spark against the Arrow engine: the evolving history of
tests/unit/test_schema_evolution.py (a column added by a batch and by ``alter``, int, float and
date widened by a batch, a decimal by ``alter``) written by each engine gives equal snapshots at
every instant, in the schema of its time; Spark's read path reads files written before a column
was added or widened (the column null, the values widened); a rehash up on Spark rewrites every
file group in the evolved schema and the table still equals the oracle."""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.exceptions import BadInputError
from spark_jobs.jobs.read import read_table
from spark_jobs.jobs.rehash import run_rehash
from spark_jobs.jobs.upsert import run_upsert as spark_upsert
from spark_jobs.table.action.alter import run_alter
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.unit.test_schema_evolution import KEYS, STEPS, _batches, _write

pytestmark = pytest.mark.spark


def _sorted(t: pa.Table) -> list[dict[str, Any]]:
    return sorted(t.to_pylist(), key=lambda r: r["id"])


def _history(spark: Any, uri: str, tmp_path: Any, engine: str) -> list[str]:
    """Run the history's steps on one engine; the instant after each step."""
    batches, instants = _batches(), []
    for step in STEPS:
        if isinstance(step, tuple):
            flag, spec = step[1]
            run_alter(uri, **({"add_columns": [spec]} if flag == "--add-column" else {"widen_columns": [spec]}))
            instants.append(Table.load(uri).timeline.completed()[-1].timestamp)
            continue
        schema, rows, kw = batches[step]
        opts = UpsertOptions(table=uri, source=_write(tmp_path / engine, f"b{step}", schema, rows), record_key=["id"],
                             precombine_field="ts", partition_field="region", delete_field="is_deleted",
                             batch_id=f"b{step}", index="bucket", table_type="merge_on_read", num_buckets=2, **kw)
        res = spark_upsert(spark, opts) if engine == "spark" else arrow_upsert(opts)
        instants.append(res["instant"])
    return instants


def test_evolving_history_on_spark_equals_arrow_at_every_instant(spark, tmp_path):
    on_spark, on_arrow = str(tmp_path / "spark_t"), str(tmp_path / "arrow_t")
    spark_instants = _history(spark, on_spark, tmp_path, "spark")
    arrow_instants = _history(spark, on_arrow, tmp_path, "arrow")
    for si, ai in zip(spark_instants, arrow_instants):
        s, a = read_arrow(on_spark, as_of=si), read_arrow(on_arrow, as_of=ai)
        assert s.schema.equals(a.schema), (si, s.schema, a.schema)
        assert _sorted(s) == _sorted(a), si
        # Spark's own read path on the same snapshot: older files lack the later columns and
        # hold the narrower types; Spark's Parquet reader fills and widens them
        df = read_table(spark, on_spark, as_of=si).toArrow()
        assert df.column_names == s.column_names, si
        assert _sorted(df.cast(s.schema)) == _sorted(s), si
    latest = {r["id"]: r for r in read_arrow(on_spark).to_pylist()}
    assert latest[KEYS[1]]["score"] is None and latest[KEYS[1]]["note"] == "n 1/%+é"  # written before `score`
    assert latest[KEYS[4]]["qty"] == 42 and latest[KEYS[4]]["price"] == 2.25  # int and float of batch 1, widened
    assert run_validate(on_spark)["ok"]
    # the Spark engine's own validation (no pre-check in front of it here) refuses as the rule says
    wide = read_arrow(on_spark).schema
    for name, schema, mode, words in [
        ("extra", wide.append(pa.field("more", pa.string())), None, "--schema-evolution add-columns"),
        ("kind", wide.set(wide.get_field_index("qty"), pa.field("qty", pa.float64())), "widen",
         "a change of kind (integer to floating point)")]:
        rows = [{**{f.name: None for f in schema}, "id": KEYS[0], "region": "eu west/1", "ts": latest[KEYS[0]]["ts"],
                 "qty": 1.5 if name == "kind" else 1}]
        src = tmp_path / f"refused_{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), src)
        before_files = sorted(p.name for p in (tmp_path / "spark_t").rglob("*") if p.is_file())
        with pytest.raises(BadInputError, match=re.escape(words)):
            spark_upsert(spark, UpsertOptions(table=on_spark, source=str(src), batch_id=f"r-{name}",
                                              schema_evolution=mode))
        assert sorted(p.name for p in (tmp_path / "spark_t").rglob("*") if p.is_file()) == before_files
    # a rehash up rewrites every file group (bucket index) in the evolved schema
    before = _sorted(read_arrow(on_spark))
    res = run_rehash(spark, on_spark, 4)
    assert res["num_buckets"] == 4
    after = read_arrow(on_spark)
    assert _sorted(after) == before and after.schema.equals(read_arrow(on_arrow).schema)
    table = Table.load(on_spark)
    for s in table.view().slices():
        with table.io.open_input_file(table.abs(s.path)) as f:
            assert "score" in pq.ParquetFile(f).schema_arrow.names, s.path
    assert run_validate(on_spark)["ok"]
    _reference_files_follow_the_evolved_schema(spark, tmp_path)


def _reference_files_follow_the_evolved_schema(spark: Any, tmp_path: Any) -> None:
    """A reference bootstrap's files (outside the table, never rewritten for a schema change)
    read an added column as null and a widened one widened, in both readers; an update of a
    referenced group writes its new base in the evolved schema."""
    from spark_jobs.jobs.bootstrap import BootstrapOptions, run_bootstrap

    root = tmp_path / "legacy"
    rows = pa.table({"id": KEYS, "qty": pa.array(range(len(KEYS)), pa.int32()),
                     "region": ["eu west/1" if i % 2 else "亚太 ap" for i in range(len(KEYS))]})
    pq.write_to_dataset(rows, str(root), partition_cols=["region"])
    uri = str(tmp_path / "ref_t")
    run_bootstrap(spark, BootstrapOptions(table=uri, source=str(root), record_key=["id"], partition_field="region",
                                          mode="reference"))
    run_alter(uri, add_columns=["note:string"], widen_columns=["qty:bigint"])
    batch = pa.table({"id": [KEYS[1]], "qty": pa.array([2**40], pa.int64()), "region": ["eu west/1"],
                      "note": ["n/%+é"]})
    src = tmp_path / "ref_b.parquet"
    pq.write_table(batch, src)
    arrow_upsert(UpsertOptions(table=uri, source=str(src), batch_id="ref1"))
    got = {r["id"]: r for r in read_arrow(uri).to_pylist()}
    assert got[KEYS[1]] == {"id": KEYS[1], "qty": 2**40, "region": "eu west/1", "note": "n/%+é"}
    assert got[KEYS[2]] == {"id": KEYS[2], "qty": 2, "region": "亚太 ap", "note": None}
    assert len(got) == len(KEYS)
    via_spark = read_table(spark, uri).toArrow()
    assert _sorted(via_spark.select(list(got[KEYS[1]]))) == sorted(got.values(), key=lambda r: r["id"])
    assert run_validate(uri)["ok"]
