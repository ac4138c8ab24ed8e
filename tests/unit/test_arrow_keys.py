"""The Arrow engine's keys and source rules without Spark: what it refuses, and its hashes.

Agreement with Spark itself is proven in tests/spark/test_keys.py and
tests/spark/test_arrow_source.py; here are the refusals (EngineUnsupportedError, so
``--engine auto`` falls back to Spark) and the pure-Python identities.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from spark_jobs.arrow_engine.keys import (
    bucket_ids,
    by_bucket,
    file_group_slots,
    key_text,
    partition_dirs,
    record_keys,
)
from spark_jobs.arrow_engine.source import (
    cast_to_table,
    read_source,
    spark_schema,
    spark_type_name,
)
from spark_jobs.exceptions import BadInputError, EngineUnsupportedError
from spark_jobs.index.hashing import buckets_of, composite_key
from spark_jobs.table.layout import partition_path
from tests.harness.cli import run_cli


@pytest.mark.parametrize("arr", [
    pa.array([1.5], pa.float64()),
    pa.array([1.5], pa.float32()),
    pa.array([dt.datetime(2024, 1, 1)], pa.timestamp("ns", "UTC")),
    pa.array([10**17 * 3], pa.timestamp("us")),  # past year 9999
    pa.array([b"x"], pa.binary()),
    pa.array([[1]], pa.list_(pa.int64())),
    pa.array([{"a": 1}], pa.struct([("a", pa.int64())])),
    pa.array([1], pa.uint32()),
    pa.array(["x"]).dictionary_encode(),
])
def test_keys_and_partitions_refuse_types_whose_text_only_spark_defines(arr):
    table = pa.table({"k": arr, "s": ["x"]})
    for call in (lambda: record_keys(table, ["k"]), lambda: record_keys(table, ["s", "k"]),
                 lambda: partition_dirs(table, ["k"])):
        with pytest.raises(EngineUnsupportedError, match="column 'k'") as e:
            call()
        assert "\n" not in str(e.value)


def test_timestamps_print_as_spark_does():
    tokyo = dt.timezone(dt.timedelta(hours=9))
    at = pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 500000, tzinfo=tokyo), dt.datetime(1970, 1, 1, 9, tzinfo=tokyo),
                   dt.datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=dt.UTC), None], pa.timestamp("us", "Asia/Tokyo"))
    assert key_text(at, name="at").to_pylist() == ["2024-01-01 18:04:05.5", "1970-01-01 00:00:00",
                                                   "1969-12-31 23:59:59.000001", None]


def test_dates_beyond_year_9999_are_refused():
    late = pa.array([dt.date(9999, 12, 31)], pa.date32()).cast(pa.int32())
    late = pa.array([late[0].as_py() + 1], pa.int32()).cast(pa.date32())
    with pytest.raises(EngineUnsupportedError, match="years 1..9999"):
        key_text(late, name="day")


def test_record_keys_escape_like_composite_key_and_null_fields_give_null_keys():
    rows = [("a", "b"), ("a,b", "c"), ("a\\", ",b"), ("ключ", "鍵"), ("", ""), ("x", None)]
    table = pa.table({"x": [r[0] for r in rows], "y": pa.array([r[1] for r in rows], pa.large_string())})
    got = record_keys(table, ["x", "y"]).to_pylist()
    assert got[:-1] == [composite_key(list(r)) for r in rows[:-1]] and got[-1] is None
    assert record_keys(table, ["y"]).to_pylist() == [r[1] for r in rows]
    typed = pa.table({"d": pa.array([dt.date(2024, 1, 2)]), "b": [True], "p": pa.array([Decimal("0.10")], pa.decimal128(5, 2))})
    assert record_keys(typed, ["d", "b", "p"]).to_pylist() == ["2024-01-02,true,0.10"]
    tiny = pa.array([Decimal("1E-8"), Decimal(0)], pa.decimal128(20, 10))
    assert key_text(tiny, name="t").to_pylist() == ["0.0000000100", "0.0000000000"]  # Arrow alone prints 1.00E-8


def test_partition_dirs_use_the_layout_rule_per_distinct_value():
    values = ["eu west", "a/b", "100%", "__NULL__", "x" * 300, None, "eu west", "東京"]
    got = partition_dirs(pa.table({"region": values}), ["region"]).to_pylist()
    assert got == [partition_path("region", v) for v in values]
    ints = partition_dirs(pa.table({"n": pa.array([7, None, -3], pa.int16())}), ["n"]).to_pylist()
    assert ints == [partition_path("n", v) for v in (7, None, -3)]
    assert partition_dirs(pa.table({"n": [1, 2]}), []).to_pylist() == ["", ""]


#: users' kinds of values: spaces, path and URL specials, non-ASCII, the key escapes, empty,
#: long text, the null directory's literal, null
ODD = ["eu west", "a/b", "100%", "x+y", "a=b", "são paulo", "東京", "🔑", "", " lead", "a,b", "a\\b", "\\,", ",",
       "x" * 300, "__NULL__", None]


def test_record_keys_and_partition_dirs_apply_the_core_rules_on_odd_values():
    """The engine's keys and directories are the core's one definition (hashing.canonical_key,
    layout.partition_dir) applied to the values' Spark texts: equal to composite_key and
    partition_path value by value, and the key is injective over these tuples."""
    pairs = [(a, b) for a in ODD for b in ODD]
    t = pa.table({"x": pa.array([a for a, _ in pairs], pa.string()), "y": pa.array([b for _, b in pairs], pa.large_string())})
    keys = record_keys(t, ["x", "y"]).to_pylist()
    assert keys == [None if a is None or b is None else composite_key([a, b]) for a, b in pairs]
    live = [k for k in keys if k is not None]
    assert len(set(live)) == len(live)
    assert record_keys(t, ["x"]).to_pylist() == [a for a, _ in pairs]
    assert partition_dirs(t, ["x"]).to_pylist() == [partition_path("x", a) for a, _ in pairs]
    # typed values: the core's rule over each field's Spark text (key_text)
    typed = pa.table({
        "price": pa.array([Decimal("0.10"), Decimal("-3.00"), None, Decimal("1E-2")], pa.decimal128(6, 2)),
        "at": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 120000, tzinfo=dt.timezone(dt.timedelta(hours=9))),
                        dt.datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=dt.UTC), dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
                        None], pa.timestamp("us", "Asia/Tokyo")),
        "name": pa.array(["a,b", "東京 /%+=", "", "x" * 300]),
    })
    texts = [key_text(typed.column(c), name=c).to_pylist() for c in ("price", "at", "name")]
    assert texts[1][0] == "2024-01-01 18:04:05.12"  # the UTC wall clock, Spark's session zone
    assert record_keys(typed, ["price", "at", "name"]).to_pylist() == [
        None if None in row else composite_key(list(row)) for row in zip(*texts)]
    assert partition_dirs(typed, ["price"]).to_pylist() == [partition_path("price", v) for v in texts[0]]


def test_bucket_ids_and_file_group_slots_are_spark_hashes():
    keys = [f"key-{i}" for i in range(2000)] + ["", "鍵", "🔑", "x" * 300]
    arr = pa.array(keys)
    for n in (1, 7, 16, 1000):
        assert bucket_ids(arr, n).tolist() == buckets_of(keys, n).tolist()
    sizes = np.array([i % 5 + 1 for i in range(len(keys))])

    def slot(k: str, n: int) -> int:  # Spark chains: the key's hash seeds the next value's
        h = xxhash.xxh64_intdigest(b"file-group", xxhash.xxh64_intdigest(k.encode(), 42))
        return (h - (1 << 64) if h >= 1 << 63 else h) % n

    assert file_group_slots(arr, sizes).tolist() == [slot(k, int(n)) for k, n in zip(keys, sizes)]
    # the one value proven against Spark: xxhash64('abc', 'file-group') = 440215938853613052
    assert file_group_slots(pa.array(["abc"]), np.array([2**62])).tolist() == [440215938853613052 % 2**62]
    with pytest.raises(ValueError):
        file_group_slots(arr, sizes[:-1])
    with pytest.raises(ValueError):
        file_group_slots(pa.array(["a"]), np.array([0]))
    with pytest.raises(ValueError):
        bucket_ids(arr, 0)


@pytest.mark.parametrize("t", [pa.time32("ms"), pa.time64("us"), pa.float16(), pa.decimal256(40, 2),
                               pa.duration("us"), pa.list_(pa.time64("us"))])
def test_spark_schema_refuses_what_spark_does_not_read_alike(t):
    with pytest.raises(EngineUnsupportedError, match="'c'"):
        spark_schema(pa.schema([("c", t)]))


def test_spark_schema_maps_types_and_refuses_nanoseconds_as_bad_input():
    s = spark_schema(pa.schema([("u8", pa.uint8()), ("u64", pa.uint64()), ("ls", pa.large_string()),
                                ("ts", pa.timestamp("ms", "Asia/Tokyo")), ("n", pa.timestamp("s")),
                                ("d", pa.date64()), ("z", pa.null())]))
    assert [f.type for f in s] == [pa.int16(), pa.decimal128(20, 0), pa.string(), pa.timestamp("us", "UTC"),
                                   pa.timestamp("us"), pa.date32(), pa.int32()]
    with pytest.raises(BadInputError, match="nanosecond") as e:
        spark_schema(pa.schema([("t", pa.timestamp("ns"))]))
    assert not isinstance(e.value, EngineUnsupportedError)
    assert spark_type_name(pa.struct([("a", pa.list_(pa.timestamp("us", "UTC"))), ("b", pa.uint8())])) \
        == "struct<a:array<timestamp>,b:smallint>"


@pytest.mark.parametrize(("values", "src", "dst"), [
    ([1.5], pa.float64(), pa.decimal128(10, 2)),  # Spark rounds Java's Double.toString
    (["1.5"], pa.string(), pa.float64()),  # Java's parser takes "1.5d", "Infinity", ...
    ([Decimal("1.5")], pa.decimal128(5, 1), pa.float64()),
    ([3 * 10**17], pa.timestamp("us"), pa.string()),  # past year 9999: Spark's own text
    (["2024-1-2"], pa.string(), pa.timestamp("us", "UTC")),  # lenient formats
    (["2024-02-30"], pa.string(), pa.date32()),
    (["\x85 5"], pa.string(), pa.int32()),  # a C1 control character Spark's trim was not checked on
    ([{"a": 1}], pa.struct([("a", pa.int64())]), pa.struct([("b", pa.int64())])),
    ([[1]], pa.list_(pa.int64()), pa.list_(pa.field("element", pa.int64(), nullable=False))),
    ([b"x"], pa.binary(), pa.string()),
])
def test_cast_to_table_refuses_casts_only_spark_decides(values, src, dst):
    with pytest.raises(EngineUnsupportedError, match="column 'c'"):
        cast_to_table(pa.table({"c": pa.array(values, src)}), pa.schema([("c", dst)]))


def test_cast_to_table_orders_columns_fills_missing_and_names_the_first_bad_column():
    batch = pa.table({"b": pa.array([2**40, 1]), "a": ["x", "y"], "del": [True, False]})
    with pytest.raises(BadInputError, match=r"^column 'b': 1 value\(s\) of type bigint cannot be cast to the "
                                            r"table's int$"):
        cast_to_table(batch, pa.schema([("a", pa.string()), ("b", pa.int32())]))
    out = cast_to_table(batch.slice(1), pa.schema([("z", pa.date32()), ("b", pa.int32()), ("a", pa.large_string())]))
    assert out.schema.names == ["z", "b", "a"] and out.to_pylist() == [{"z": None, "b": 1, "a": "y"}]
    assert out.schema.field("a").type == pa.large_string()


def _write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_read_source_refuses_what_only_spark_reads(tmp_path: Path):
    table = pa.schema([("a", pa.int64()), ("b", pa.string())])
    hive = tmp_path / "hive" / "k=1"
    hive.mkdir(parents=True)
    pq.write_table(pa.table({"a": [1]}), hive / "p.parquet")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    pq.write_table(pa.table({"a": [1]}), mixed / "p1.parquet")
    pq.write_table(pa.table({"a": [1], "b": ["x"]}), mixed / "p2.parquet")
    refused = [
        (_write(tmp_path / "new.json", '{"a": 1}\n'), "json", None),  # a new table: Spark's inference
        (_write(tmp_path / "new.csv", "a\n1\n"), "csv", None),
        (str(tmp_path / "hive"), "parquet", None),
        (str(mixed), "parquet", None),
        (_write(tmp_path / "big.json", '{"a": 99999999999999999999}\n'), "json", table),
        (_write(tmp_path / "quotes.json", "{'a': 1}\n"), "json", table),  # Jackson allows single quotes
        (_write(tmp_path / "kinds.json", '{"a": 1}\n{"a": "x"}\n'), "json", table),
        (_write(tmp_path / "nested.json", '{"a": 1, "b": {"c": 1}}\n'), "json", table),
        (_write(tmp_path / "double.csv", "a,b\n1.5,x\n"), "csv", table),  # Spark infers double, date, ...
        (_write(tmp_path / "ids.csv", "a,b\n1,2024-01-01\n"), "csv", table),
        (_write(tmp_path / "escaped.csv", 'a,b\n1,"x\\"y"\n'), "csv", table),
        (_write(tmp_path / "multiline.csv", 'a,b\n1,"x\ny"\n'), "csv", table),
        (_write(tmp_path / "dup.csv", "a,a\n1,2\n"), "csv", table),
    ]
    for uri, fmt, schema in refused:
        with pytest.raises(EngineUnsupportedError) as e:
            read_source(uri, fmt, table_schema=schema)
        assert "\n" not in str(e.value), uri


def test_read_source_errors_are_bad_input(tmp_path: Path):
    with pytest.raises(BadInputError, match="does not exist"):
        read_source(str(tmp_path / "absent"), "parquet", table_schema=None)
    with pytest.raises(BadInputError, match="unknown source format 'orc'"):
        read_source(str(tmp_path), "orc", table_schema=None)
    junk = _write(tmp_path / "junk.parquet", "junk")
    with pytest.raises(BadInputError, match=f"^source file {junk} is corrupt or not Parquet"):
        read_source(junk, "parquet", table_schema=None)
    bad = _write(tmp_path / "bad.json", '{"a": 1}\n{"a": \n')
    with pytest.raises(BadInputError, match="malformed JSON records") as e:
        read_source(bad, "json", table_schema=pa.schema([("a", pa.int64())]))
    assert not isinstance(e.value, EngineUnsupportedError)


def test_csv_and_json_types_follow_spark_inference(tmp_path: Path):
    csv = read_source(_write(tmp_path / "b.csv", 'id,n,big,ok,note\nu-1,007,3000000000,TRUE,""\nu-2,,1,false, \n'),
                      "csv", table_schema=pa.schema([]))
    assert [f.type for f in csv.schema] == [pa.string(), pa.int32(), pa.int64(), pa.bool_(), pa.string()]
    assert csv.to_pylist()[0] == {"id": "u-1", "n": 7, "big": 3000000000, "ok": True, "note": None}
    js = read_source(_write(tmp_path / "b.json", '{"z": "2024-01-01", "a": 1, "n": null}\n{"a": 2.5}\n'),
                     "json", table_schema=pa.schema([]))
    assert js.schema.names == ["a", "n", "z"]  # Spark sorts inferred JSON fields
    assert [f.type for f in js.schema] == [pa.float64(), pa.string(), pa.string()]


def test_arrow_engine_modules_never_import_pyspark(tmp_path: Path):
    f = tmp_path / "b.parquet"
    pq.write_table(pa.table({"k": ["a"], "n": [1]}), f)
    code = (
        "import sys\n"
        "import pyarrow as pa\n"
        "from spark_jobs.arrow_engine import keys, source\n"
        f"t = source.read_source({str(f)!r}, 'parquet', table_schema=None)\n"
        "t = source.cast_to_table(t, pa.schema([('k', pa.string()), ('n', pa.int32())]))\n"
        "k = keys.record_keys(t, ['k', 'n'])\n"
        "keys.partition_dirs(t, ['k']); keys.bucket_ids(k, 4)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_numeric_strings_longer_than_4300_digits_cast_as_spark_parses_them(tmp_path: Path):
    """Spark parses an integer text digit by digit: leading zeros count for nothing, and a value
    beyond the type is try_cast's null (refused, one line). CPython would refuse to build an
    int from more than 4,300 digits (issue 36, item 10): the Arrow engine must not try."""
    zeros = "0" * 5000
    out = cast_to_table(pa.table({"id": [zeros + "1", "-" + zeros + "12", f" +{zeros}9 ", None]}),
                        pa.schema([("id", pa.int64())]))
    assert out.column("id").to_pylist() == [1, -12, 9, None]
    for big in ("9" * 5000, "1" + zeros, "9223372036854775808", "-9223372036854775809"):
        with pytest.raises(BadInputError, match=r"^column 'id': 1 value\(s\) of type string cannot be cast to the "
                                                r"table's bigint$"):
            cast_to_table(pa.table({"id": [zeros + "1", big]}), pa.schema([("id", pa.int64())]))
    csv = read_source(_write(tmp_path / "z.csv", f"id,n\nu 1,{zeros}7\nu/2,-{zeros}\n"), "csv",
                      table_schema=pa.schema([]))
    assert csv.schema.field("n").type == pa.int32() and csv.column("n").to_pylist() == [7, 0]
    with pytest.raises(EngineUnsupportedError, match="beyond a long"):
        read_source(_write(tmp_path / "big.csv", f"id,n\nu 1,{'9' * 5000}\n"), "csv", table_schema=pa.schema([]))


def test_a_bigint_key_sent_as_a_5001_digit_string_upserts_on_the_arrow_engine(tmp_path: Path):
    import hashlib
    import json

    from spark_jobs.arrow_engine.upsert import run_upsert
    from spark_jobs.table.action.upsert import UpsertOptions
    from spark_jobs.table.reader import read_arrow

    uri = str(tmp_path / "t")
    first = tmp_path / "b1.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "region": ["eu west", None], "v": ["a", "b"]}), first)
    run_upsert(UpsertOptions(table=uri, source=str(first), record_key=["id"], partition_field="region", batch_id="b1"))

    def cli(src: Path) -> subprocess.CompletedProcess:
        return run_cli("upsert", uri, str(src), "--engine", "arrow", timeout=120)

    def digest() -> str:
        h = hashlib.sha256()
        for p in sorted(Path(uri).rglob("*")):
            h.update(str(p.relative_to(uri)).encode() + (p.read_bytes() if p.is_file() else b""))
        return h.hexdigest()

    update = tmp_path / "b2.parquet"
    pq.write_table(pa.table({"id": ["0" * 5000 + "1"], "region": ["eu west"], "v": ["a2"]}), update)
    p = cli(update)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1])["counts"]["updated"] == 1
    assert sorted((r["id"], r["v"]) for r in read_arrow(uri).to_pylist()) == [(1, "a2"), (2, "b")]

    overflow = tmp_path / "b3.parquet"
    pq.write_table(pa.table({"id": ["9" * 5000], "region": ["eu west"], "v": ["x"]}), overflow)
    before = digest()
    p = cli(overflow)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.strip().splitlines() == [
        "bucketindex: error: column 'id': 1 value(s) of type string cannot be cast to the table's bigint"]
    assert digest() == before


@pytest.mark.parametrize("n,buckets", [(1, 7), (500, 1), (2_000, 13), (5_000, 300)])
def test_by_bucket_groups_as_one_filter_per_bucket_did(n, buckets):
    """The tag phase's grouping (one sort) gives what a filter of the batch per bucket gave:
    the same buckets in ascending order, each with its keys in batch order."""
    keys = pa.array([f"key-{(i * 7919) % (n * 3)}" if i % 11 else None for i in range(n)], pa.string())
    b = bucket_ids(pa.array([f"key-{i}" for i in range(n)]), buckets)
    got = by_bucket(keys, b)
    want = [(int(u), keys.filter(pa.array(b == u))) for u in np.unique(b)]
    assert [u for u, _ in got] == [u for u, _ in want] == sorted({int(x) for x in b})
    assert all(g.equals(w) for (_, g), (_, w) in zip(got, want))
    assert sum(len(g) for _, g in got) == n


def test_by_bucket_of_nothing_and_of_mismatched_input():
    assert by_bucket(pa.array([], pa.string()), np.empty(0, np.int64)) == []
    with pytest.raises(ValueError, match="one bucket per key"):
        by_bucket(pa.array(["a", "b"]), np.array([0]))
