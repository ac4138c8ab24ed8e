"""One order of precombine values in every path (issue 36 item 2; format.md §8).

format.md §8 orders precombine values as Spark orders SQL values: null lowest, NaN above every
number (NaNs equal), -0.0 equal to 0.0. Before, copy-on-write's staleness check compared with
Arrow's ``greater`` (false both ways for NaN): ``{pc: NaN}`` then ``{pc: 5.0}`` kept ``a-5`` on
copy-on-write while merge-on-read's read-time merge ranked NaN highest and kept ``a-nan``; a
delete or a partition move at 5.0 against a stored NaN went through on both table types. Here
each path -- the write-time check of copy-on-write and of merge-on-read (deletes), a mover's
check (record, global_simple), the read-time merge, compaction, the in-batch dedupe -- is held
to the oracle (tests/oracle.py, which orders by §8 on its own), for double and float columns.
The Spark engine is held to the same results in tests/spark/test_precombine_order_spark.py.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.compact import run_compact
from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.table.action.compact import CompactionPolicy
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.ordering import older, ranks, sort_key
from spark_jobs.table.reader import read_arrow
from tests.oracle import precombine_order, reduce_batches, rows_by_identity

pytestmark = pytest.mark.unit

NAN, INF = math.nan, math.inf
TYPES = {"double": pa.float64(), "float": pa.float32()}


def schema(pc_type: pa.DataType) -> pa.Schema:
    return pa.schema([("k", pa.string()), ("region", pa.string()), ("pc", pc_type), ("v", pa.string()),
                      ("del", pa.bool_())])


def row(k: str, pc: float | None, v: str, *, region: str | None = "eu west", delete: bool = False) -> dict[str, Any]:
    return {"k": k, "region": region, "pc": pc, "v": v, "del": delete}


#: stored rows (batch 1), then what arrives (batch 2), then more (batch 3): every pair of
#: special values in both orders, a delete and a move against a stored NaN, ties of NaN and of
#: signed zeros (the incoming row wins a tie: "not lower"), and duplicates inside one batch
B1 = [row("nan then 5 ü", NAN, "a-nan"), row("nan then delete/1", NAN, "d-nan"), row("5 then nan", 5.0, "b-5"),
      row("nan then nan %", NAN, "c-first"), row("null then nan", None, "e-null"), row("nan then null", NAN, "f-nan"),
      row("-0 then 0", -0.0, "g-neg"), row("0 then -0", 0.0, "h-pos"), row("nan then inf", NAN, "i-nan"),
      row("inf then nan", INF, "j-inf"), row("nan moves+", NAN, "m-nan"), row("nan moves on a tie", NAN, "n-nan"),
      row("null then -inf", None, "o-null"), row("nan then delete at nan", NAN, "p-nan")]
B2 = [row("nan then 5 ü", 5.0, "a-5"), row("nan then delete/1", 5.0, "d-5", delete=True), row("5 then nan", NAN, "b-nan"),
      row("nan then nan %", NAN, "c-second"), row("null then nan", NAN, "e-nan"), row("nan then null", None, "f-null"),
      row("-0 then 0", 0.0, "g-pos"), row("0 then -0", -0.0, "h-neg"), row("nan then inf", INF, "i-inf"),
      row("inf then nan", NAN, "j-nan"), row("nan moves+", 5.0, "m-5", region="a/b"),
      row("nan moves on a tie", NAN, "n-moved", region="são paulo"), row("null then -inf", -INF, "o-inf"),
      row("nan then delete at nan", NAN, "p-del", delete=True),
      # in one batch: NaN beats 5.0 whichever comes first
      row("in batch 5 first", 5.0, "q-5"), row("in batch 5 first", NAN, "q-nan"),
      row("in batch nan first", NAN, "r-nan"), row("in batch nan first", 5.0, "r-5")]
B3 = [row("nan then 5 ü", 7.0, "a-7", delete=True), row("5 then nan", 1e30, "b-big"),
      row("in batch nan first", 6.0, "r-6"), row("-0 then 0", -0.0, "g-neg-again")]


def write(path: Path, rows: list[dict[str, Any]], pc_type: pa.DataType) -> str:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema(pc_type)), path)
    return str(path)


def comparable(rows: dict[Any, dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """NaN spelled out: it is equal to itself in §8's order, not in Python's ``==``."""
    return {k: {c: "NaN" if isinstance(v, float) and math.isnan(v) else v for c, v in r.items()}
            for k, r in rows.items()}


@pytest.mark.parametrize("pc_type", ["double", "float"])
@pytest.mark.parametrize("index", ["record", "bucket", "global_simple"])
@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_nan_and_signed_zero_precombine_values_decide_alike_in_every_path(tmp_path, table_type, index, pc_type):
    uri = str(tmp_path / "t")
    typ = TYPES[pc_type]
    per_partition = "region" if index == "bucket" else None
    sent: list[list[dict[str, Any]]] = []
    for i, rows in enumerate([B1, B2, B3], start=1):
        run_upsert(UpsertOptions(table=uri, source=write(tmp_path / f"b{i}.parquet", rows, typ), record_key=["k"],
                                 precombine_field="pc", partition_field="region", delete_field="del",
                                 index=index, table_type=table_type, batch_id=f"b{i}", num_buckets=2))
        sent.append(rows)
        expected = comparable(reduce_batches(sent, key="k", precombine="pc", delete_field="del",
                                             partition=per_partition))
        got = comparable(rows_by_identity(read_arrow(uri).to_pylist(), key="k", partition=per_partition))
        assert got == expected, f"after batch {i}"
        if i == 2:  # the case, stated outright: the stored NaN is the newer row
            ident = ("eu west", "nan then 5 ü") if per_partition else "nan then 5 ü"
            assert got[ident]["v"] == "a-nan"
    if table_type == "merge_on_read":  # compaction folds the logs by the same order
        run_compact(uri, policy=CompactionPolicy(min_logs=1, min_deltas=2))
        assert comparable(rows_by_identity(read_arrow(uri).to_pylist(), key="k", partition=per_partition)) == expected
    assert run_validate(uri)["ok"]


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_a_nan_tie_in_one_batch_goes_to_the_greater_row(tmp_path, table_type):
    """Two rows of one key, both NaN: a tie on the precombine value, decided by the rest of the
    source row (format.md §8) -- the greater ``v`` -- whichever comes first in the file."""
    uri = str(tmp_path / "t")
    rows = [row("tie a", NAN, "x"), row("tie a", NAN, "y"), row("tie b", NAN, "y"), row("tie b", NAN, "x"),
            row("zero tie", 0.0, "x"), row("zero tie", -0.0, "y")]
    run_upsert(UpsertOptions(table=uri, source=write(tmp_path / "b.parquet", rows, pa.float64()), record_key=["k"],
                             precombine_field="pc", delete_field="del", table_type=table_type, batch_id="b1"))
    got = {r["k"]: r["v"] for r in read_arrow(uri).to_pylist()}
    assert got == {"tie a": "y", "tie b": "y", "zero tie": "y"}


@pytest.mark.parametrize("typ", [pa.float64(), pa.float32()])
def test_the_core_order_is_format_section_8s(typ):
    """``table.ordering`` against the oracle's independent key, over every special value."""
    values = [None, NAN, INF, 5.0, 0.0, -0.0, -1.5, -INF, None, NAN, 5.0]
    arr = pa.array(values, typ)
    r = ranks(arr)
    for i, a in enumerate(values):
        for j, b in enumerate(values):
            assert (r[i] < r[j]) == (precombine_order(a) < precombine_order(b)), (a, b)
            assert (r[i] == r[j]) == (precombine_order(a) == precombine_order(b)), (a, b)
            assert (sort_key(a) < sort_key(b)) == (precombine_order(a) < precombine_order(b)), (a, b)
    inc = pa.array([a for a in values for _ in values], typ)
    sto = pa.array([b for _ in values for b in values], pa.float64())  # a stored column of another width
    want = [precombine_order(a) < precombine_order(b) for a in values for b in values]
    assert older(inc, sto).to_pylist() == want
