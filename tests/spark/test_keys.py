"""The JVM and Python sides must agree on keys and buckets, or records land in the wrong place."""

from __future__ import annotations

import random

import pytest
from pyspark.sql import functions as F

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
    tuples = [("a", "b"), ("a,b", "c"), ("a", "b,c"), ("a\\", ",b"), ("ключ", "鍵"), ("1", "2")]
    df = spark.createDataFrame(tuples, "x string, y string")
    got = {(r["x"], r["y"]): r["k"] for r in df.select("x", "y", key_expr(["x", "y"]).alias("k")).collect()}
    for t in tuples:
        assert got[t] == composite_key(list(t))
    assert len(set(got.values())) == len(tuples)


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
