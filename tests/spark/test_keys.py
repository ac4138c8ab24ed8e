"""The JVM and Python sides must agree on keys and buckets, or records land in the wrong place."""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from spark_jobs.arrow_engine.keys import (
    bucket_ids,
    file_group_slots,
    partition_dirs,
    record_keys,
)
from spark_jobs.index.hashing import bucket_hash, bucket_of, composite_key
from spark_jobs.jobs.keys import bucket_expr, key_expr, partition_expr
from spark_jobs.table.layout import partition_path

pytestmark = pytest.mark.spark

KEYS = ["", "a", "key-0001", "ключ", "鍵", "🔑", "naïve café", "a,b", "a\\b", "x" * 300,
        *[f"{random.Random(i).getrandbits(64):x}-{i}" for i in range(500)]]


def test_python_bucket_equals_spark_xxhash64(spark):
    df = spark.createDataFrame([(k,) for k in KEYS], "k string")
    rows = df.select("k", F.xxhash64("k").alias("h"), *[bucket_expr(F.col("k"), n).alias(f"b{n}") for n in (1, 2, 7, 16, 1000)]).collect()
    assert len(rows) == len(KEYS)
    for r in rows:
        assert r["h"] == bucket_hash(r["k"]), r["k"]
        for n in (1, 2, 7, 16, 1000):
            assert r[f"b{n}"] == bucket_of(r["k"], n), (r["k"], n)
    assert any(r["h"] < 0 for r in rows), "test data should include negative hashes (pmod path)"


def test_composite_key_expression_equals_python(spark):
    odd = [v for v in USER_VALUES if v is not None]
    tuples = [("a", "b"), ("a,b", "c"), ("a", "b,c"), ("a\\", ",b"), ("ключ", "鍵"), ("1", "2"),
              *[(a, b) for a in odd[::3] for b in odd[::4]]]
    df = spark.createDataFrame(tuples, "x string, y string")
    got = {(r["x"], r["y"]): r["k"] for r in df.select("x", "y", key_expr(["x", "y"]).alias("k")).collect()}
    for t in tuples:
        assert got[t] == composite_key(list(t))
    assert len(set(got.values())) == len(set(tuples))
    # a null field: a null key (the batch checks refuse it)
    assert df.sparkSession.createDataFrame([("a", None)], "x string, y string").select(
        key_expr(["x", "y"]).alias("k")).first()["k"] is None


def test_integer_keys_cast_like_python(spark):
    df = spark.createDataFrame([(1, 10), (-5, 20)], "a long, b int")
    got = [r["k"] for r in df.select(key_expr(["a", "b"]).alias("k")).orderBy("a").collect()]
    assert got == [composite_key([-5, 20]), composite_key([1, 10])]


def test_partition_path_equals_spark_partition_expr(spark):
    values = ["eu west", "a/b", "100%", "x+y", "~tilde*star_dash-.dot", "são paulo", "亚太 ap", "a=b&c?d#e", None]
    df = spark.createDataFrame([(v,) for v in values], "region string")
    got = {r["region"]: r["p"] for r in df.select("region", partition_expr(["region"]).alias("p")).collect()}
    assert got == {v: partition_path("region", v) for v in values}
    ints = spark.createDataFrame([(7,), (-3,), (None,)], "n int").select("n", partition_expr(["n"]).alias("p"))
    assert {r["n"]: r["p"] for r in ints.collect()} == {n: partition_path("n", n) for n in (7, -3, None)}


#: null, the empty string and literals that look like the null directory, path tricks, and
#: long values whose readable prefix would end inside a ``%XX`` escape (format.md §1)
ADDRESS = "東京都千代田区千代田一丁目一番一号皇居東御苑内"
TRICKY = ["", "__NULL__", "__HIVE_DEFAULT_PARTITION__", "_", "__", "___", "_x", "__x", "%5F_NULL__", ".", "..",
          "/abs", "../../escape", ".bucketindex", "\x00", "a\nb", "~", "x" * 300, ADDRESS, ADDRESS * 3, "~" * 100,
          "__" + "y" * 300, *["a" * k + "é" * 100 for k in range(6)], *["b" * k + "%" * 80 for k in range(3)], None]


@pytest.mark.parametrize("field", ["region", "地域", "f" * 128])
def test_partition_dirs_distinct_short_and_equal_to_spark(spark, field):
    df = spark.createDataFrame([(v,) for v in TRICKY], "v string").withColumnRenamed("v", field)
    got = {r[0]: r[1] for r in df.select(field, partition_expr([field]).alias("p")).collect()}
    assert got == {v: partition_path(field, v) for v in TRICKY}
    assert len(set(got.values())) == len(TRICKY), "two values share a directory"
    for v, d in got.items():
        assert len(d.encode()) <= 200 and "/" not in d and "\x00" not in d and "\n" not in d, (v, d)
        assert d.startswith(f"{field}=") and d not in (".", "..")
    assert got[None] == f"{field}=__NULL__" and got["__NULL__"] == f"{field}=%5F_NULL__"
    assert got["x" * 300] == partition_path(field, "x" * 300) and "~" in got["x" * 300]


# -- the Arrow engine's twins (spark_jobs.arrow_engine.keys) -----------------------------------

#: users' kinds of values: separators, URL specials, non-ASCII (CJK, emoji), long text, dunder
#: and null-marker literals, composite-key escapes
USER_VALUES = ["eu west", "a/b", "100%", "x+y", "a=b", "são paulo", "亚太 ap", "東京", "🔑🚀", "naïve café",
               "__x", "__NULL__", "%5F_NULL__", "a,b", "a\\b", "\\,", ",", "", " lead", "trail ", "tab\tnew\nline",
               "x" * 250, "é" * 120, ADDRESS * 4, "~tilde*star", None]


def _arrow_vs_spark(spark, table, key_sets, part_fields):
    """Routing of every row by the Arrow twins and by the Spark expressions, row by row."""
    n = table.num_rows
    table = table.append_column("_id", pa.array(range(n), pa.int64())).append_column(
        "_n", pa.array([i % 7 + 1 for i in range(n)], pa.int64()))
    df = spark.createDataFrame(table)
    sizes = np.array([i % 7 + 1 for i in range(n)])
    cols = []  # one query for everything: each Spark query costs a cold session seconds
    for j, fields in enumerate(key_sets):
        key = key_expr(fields)
        cols += [key.alias(f"k{j}"), *[bucket_expr(key, b).alias(f"k{j}b{b}") for b in (1, 7, 16, 1000)],
                 F.pmod(F.xxhash64(key, F.lit("file-group")), F.col("_n")).alias(f"k{j}slot")]
    cols += [partition_expr([f]).alias(f"p{j}") for j, f in enumerate(part_fields)]
    rows = df.select("_id", *cols).orderBy("_id").collect()
    for j, fields in enumerate(key_sets):
        keys = record_keys(table, fields)
        assert keys.type == pa.string()
        assert keys.to_pylist() == [r[f"k{j}"] for r in rows], fields
        live = [i for i, r in enumerate(rows) if r[f"k{j}"] is not None]
        live_keys = keys.take(pa.array(live, pa.int64()))
        for b in (1, 7, 16, 1000):
            assert bucket_ids(live_keys, b).tolist() == [rows[i][f"k{j}b{b}"] for i in live], (fields, b)
        assert file_group_slots(live_keys, sizes[live]).tolist() == [rows[i][f"k{j}slot"] for i in live], fields
    for j, f in enumerate(part_fields):
        assert partition_dirs(table, [f]).to_pylist() == [r[f"p{j}"] for r in rows], f
    assert partition_dirs(table, []).to_pylist() == [""] * n


def test_arrow_keys_and_routing_equal_spark_on_strings(spark):
    vals = USER_VALUES + [f"{random.Random(i).getrandbits(64):x}-{i}" for i in range(200)]
    other = list(reversed(vals))
    table = pa.table({"region": pa.array(vals, pa.string()), "地域": pa.array(other, pa.large_string()),
                      "f" * 128: pa.array(vals, pa.string())})
    _arrow_vs_spark(spark, table, [["region"], ["region", "地域"], ["地域", "region", "f" * 128]],
                    ["region", "地域", "f" * 128])


def test_arrow_keys_and_routing_equal_spark_on_typed_columns(spark):
    n = 60
    rnd = random.Random(7)
    table = pa.table({
        "i8": pa.array([rnd.randint(-128, 127) for _ in range(n - 1)] + [None], pa.int8()),
        "i16": pa.array([rnd.randint(-2**15, 2**15 - 1) for _ in range(n)], pa.int16()),
        "i32": pa.array([-2**31, 2**31 - 1] + [rnd.randint(-2**31, 2**31 - 1) for _ in range(n - 2)], pa.int32()),
        "i64": pa.array([-2**63, 2**63 - 1, 0] + [rnd.getrandbits(64) - 2**63 for _ in range(n - 3)], pa.int64()),
        "flag": pa.array([i % 3 == 0 if i % 5 else None for i in range(n)], pa.bool_()),
        "day": pa.array([dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1970, 1, 1), dt.date(1969, 12, 31)]
                        + [dt.date(2024, 1, 1) + dt.timedelta(days=rnd.randint(-40000, 40000)) for _ in range(n - 5)]
                        + [None], pa.date32()),
        "price": pa.array([Decimal("0.00"), Decimal("-0.50"), Decimal("12345678.90"), None]
                          + [Decimal(rnd.randint(-10**9, 10**9)) / 100 for _ in range(n - 4)], pa.decimal128(10, 2)),
        "tiny": pa.array([Decimal("0E-18"), Decimal("1E-18"), Decimal("-123.000000123000000000")]
                         + [Decimal(rnd.randint(-10**20, 10**20)).scaleb(-18) for _ in range(n - 3)],
                         pa.decimal128(38, 18)),
        "whole": pa.array([Decimal(10**30), Decimal(0), Decimal(-7)] + [Decimal(rnd.getrandbits(90)) for _ in range(n - 3)],
                          pa.decimal128(38, 0)),
        "name": pa.array([rnd.choice(USER_VALUES[:-1]) for _ in range(n)], pa.string()),
        # Spark prints the UTC wall clock (session zone) and cuts the fraction's trailing zeros
        "at": pa.array([dt.datetime(1, 1, 1, tzinfo=dt.UTC), dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
                        dt.datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=dt.UTC), None]
                       + [dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=rnd.getrandbits(50))
                          * rnd.choice([1, -1]) for _ in range(n - 4)], pa.timestamp("us", "UTC")),
        "local": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 120000), dt.datetime(2024, 1, 2, 3, 4, 5, 1), None,
                           dt.datetime(1970, 1, 1)] + [dt.datetime(2000, 1, 1) + dt.timedelta(milliseconds=rnd.getrandbits(40))
                                                       for _ in range(n - 4)], pa.timestamp("us")),
    })
    typed = ["i8", "i16", "i32", "i64", "flag", "day", "price", "tiny", "whole", "at", "local"]
    _arrow_vs_spark(spark, table, [[c] for c in typed] + [["name", "i64"], ["day", "name", "flag"],
                                                          ["price", "tiny", "name"], ["at", "local"]], typed)
    # a zone-aware source column is the same instant, whatever zone Arrow carries it in
    tokyo = table.set_column(table.column_names.index("at"), "at", table.column("at").cast(pa.timestamp("us", "Asia/Tokyo")))
    assert record_keys(tokyo, ["at"]).equals(record_keys(table, ["at"]))
