"""The Arrow engine reads and casts a batch as the Spark path does (spark_jobs.arrow_engine.source).

Each case reads one file both ways -- ``spark_jobs.jobs.source.read_source`` plus the upsert's
``try_cast`` (``castability_checks``/``raise_uncastable``) against the Arrow twins -- and
compares schemas, values and error lines. Spark queries are batched: each costs a cold
session seconds.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from spark_jobs.arrow_engine import source as arrow_source
from spark_jobs.exceptions import BadInputError, EngineUnsupportedError
from spark_jobs.jobs import source as spark_source

pytestmark = pytest.mark.spark

TOKYO = dt.timezone(dt.timedelta(hours=9))


def _spark_batch(spark, uri: str, fmt: str, table: pa.Schema | None) -> pa.Table:
    """The Spark path: read, count uncastable values, raise as the upsert does, try_cast."""
    df = spark_source.read_source(spark, uri, fmt)
    if table is None:
        return df.toArrow()
    target = from_arrow_schema(table)
    checks = spark_source.castability_checks(df, target)
    casts = [(F.col(f.name).try_cast(f.dataType) if f.name in df.columns else F.lit(None).cast(f.dataType))
             .alias(f.name) for f in target.fields]
    if checks:
        row = df.agg(*[a for _, a in checks]).collect()[0]
        spark_source.raise_uncastable(df, target, row, [n for n, _ in checks])
    return df.select(*casts).toArrow()


def _arrow_batch(uri: str, fmt: str, table: pa.Schema | None) -> pa.Table:
    raw = arrow_source.read_source(uri, fmt, table_schema=table)
    return raw if table is None else arrow_source.cast_to_table(raw, table)


def _same(spark, uri: str, fmt: str, table: pa.Schema | None = None) -> pa.Table:
    got, want = _arrow_batch(uri, fmt, table), _spark_batch(spark, uri, fmt, table)
    assert got.column_names == want.column_names
    for name in want.column_names:
        assert got.schema.field(name).type.equals(want.schema.field(name).type), name
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    return got


def _errors(spark, uri: str, fmt: str, table: pa.Schema | None = None) -> tuple[str, str]:
    with pytest.raises(BadInputError) as arrow_err:
        _arrow_batch(uri, fmt, table)
    assert not isinstance(arrow_err.value, EngineUnsupportedError), arrow_err.value
    with pytest.raises(BadInputError) as spark_err:
        _spark_batch(spark, uri, fmt, table)
    return str(arrow_err.value), str(spark_err.value)


def test_parquet_types_read_as_spark_reads_them(spark, tmp_path: Path):
    """spark_schema equals to_arrow_schema(spark.read.parquet(f).schema), and the values agree."""
    n = 4
    table = pa.table({
        "id": pa.array(["a", "b/é", "鍵 🔑", None], pa.large_string()),
        "i8": pa.array([1, -2, None, 127], pa.int8()),
        "u8": pa.array([0, 255, None, 7], pa.uint8()),
        "u16": pa.array([0, 65535, None, 7], pa.uint16()),
        "u32": pa.array([0, 2**32 - 1, None, 7], pa.uint32()),
        "u64": pa.array([0, 2**64 - 1, None, 7], pa.uint64()),
        "cat": pa.array(["x", "y", None, "x"]).dictionary_encode(),
        "f32": pa.array([1.5, None, -0.0, 3.25], pa.float32()),
        "ts_tokyo": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=TOKYO)] * 3 + [None], pa.timestamp("ms", "Asia/Tokyo")),
        "ts_s": pa.array([dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=dt.UTC)] * n, pa.timestamp("s", "UTC")),
        "naive": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 123000), None, dt.datetime(1900, 1, 1), dt.datetime(2999, 1, 1)],
                          pa.timestamp("ms")),
        "d32": pa.array([dt.date(2024, 2, 29), None, dt.date(1, 1, 1), dt.date(9999, 12, 31)], pa.date32()),
        "d64": pa.array([dt.date(2024, 2, 29), None, dt.date(1970, 1, 1), dt.date(1969, 12, 31)], pa.date64()),
        "price": pa.array([Decimal("1.50"), None, Decimal("-0.01"), Decimal("99999999.99")], pa.decimal128(10, 2)),
        "big": pa.array([Decimal("1.5")] * n, pa.decimal256(20, 1)),
        "bin": pa.array([b"\x00\xff", None, b"", b"abc"], pa.large_binary()),
        "fsb": pa.array([b"ab", b"cd", None, b"ef"], pa.binary(2)),
        "tags": pa.array([[1, 2], [], None, [None, 3]], pa.list_(pa.int32())),
        "names": pa.array([["a"], None, ["b", "c"], []], pa.large_list(pa.large_string())),
        "pair": pa.array([[1, 2], None, [3, 4], [5, 6]], pa.list_(pa.int64(), 2)),
        "addr": pa.array([{"zip": "100", "n": 1}, None, {"zip": None, "n": 2}, {"zip": "x", "n": None}],
                         pa.struct([("zip", pa.string()), ("n", pa.int64())])),
        "attrs": pa.array([[("k", 1)], None, [], [("a", None)]], pa.map_(pa.string(), pa.int64())),
        "events": pa.array([[dt.datetime(2024, 1, 1, tzinfo=TOKYO)], None, [], [None]],
                           pa.list_(pa.timestamp("ms", "Europe/Paris"))),
        "empty": pa.nulls(n),
        "flag": pa.array([True, False, None, True]),
    })
    f = tmp_path / "batch.parquet"
    pq.write_table(table, f)
    spark_read = spark_source.read_source(spark, str(f), "parquet")
    assert arrow_source.spark_schema(table.schema).equals(to_arrow_schema(spark_read.schema, timezone="UTC"))
    got = _same(spark, str(f), "parquet")
    assert got.schema.equals(arrow_source.spark_schema(table.schema))


def test_parquet_directory_read_as_spark_reads_it(spark, tmp_path: Path):
    d = tmp_path / "dir"
    d.mkdir()
    pq.write_table(pa.table({"id": ["a", "b"], "n": [1, 2]}), d / "part-0.parquet")
    pq.write_table(pa.table({"id": ["c"], "n": [3]}), d / "part-1.parquet")
    (d / "_SUCCESS").write_text("")
    (d / ".hidden.parquet").write_bytes(b"junk")  # (a junk .crc would break Hadoop's own read)
    (d / "_temporary").mkdir()
    (d / "_temporary" / "junk.parquet").write_bytes(b"junk")
    got = _same(spark, str(d), "parquet")
    assert sorted(got.column("id").to_pylist()) == ["a", "b", "c"]


def test_source_errors_read_as_on_the_spark_path(spark, tmp_path: Path):
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"a": [1]}), good)
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(good.read_bytes()[:-10])
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    for uri, fmt in [(junk, "parquet"), (empty, "parquet"), (truncated, "parquet"), (tmp_path / "absent", "parquet"),
                     (good, "orc"), (nothing, "parquet")]:
        arrow_msg, spark_msg = _errors(spark, str(uri), fmt)
        assert arrow_msg == spark_msg
    assert "is corrupt or not Parquet" in _errors(spark, str(junk), "parquet")[0]


def test_malformed_json_is_bad_input_on_both_paths(spark, tmp_path: Path):
    schema = pa.schema([("id", pa.string()), ("n", pa.int64())])
    for i, text in enumerate(['{"id": "a", "n": 1}\n{"id": "b", "n": 2\n', '{"id": "a"}\nnot json\n']):
        f = tmp_path / f"bad{i}.json"
        f.write_text(text)
        arrow_msg, spark_msg = _errors(spark, str(f), "json", schema)
        assert arrow_msg == f"source {f} has malformed JSON records"
        assert spark_msg.startswith(f"cannot read json source {f}")  # Spark's own line names a Py4J call


def test_json_batch_into_a_table_equals_spark(spark, tmp_path: Path):
    rows = [
        {"id": "a/1", "n": 1, "big": 3, "score": 1.5, "ok": True, "when": "2024-01-02T03:04:05+09:00",
         "local": "2024-01-02 03:04:05.1234567", "day": "2024-02-29", "code": "007", "yes": "Y"},
        {"id": "鍵 🔑", "n": -5, "big": None, "score": 2, "ok": False, "when": "2024-01-02", "local": "2024-01-02T00:00:00Z",
         "day": "2024-01-02T10:00:00", "code": " 12 ", "yes": "no"},
        {"id": "x", "n": None, "score": None, "ok": None, "when": None, "local": None, "day": None, "code": None,
         "yes": None, "extra_null": None},
    ]
    f = tmp_path / "batch.json"
    f.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n\n")
    table = pa.schema([("id", pa.string()), ("n", pa.int32()), ("big", pa.decimal128(12, 2)), ("score", pa.float64()),
                       ("ok", pa.bool_()), ("when", pa.timestamp("us", "UTC")), ("local", pa.timestamp("us")),
                       ("day", pa.date32()), ("code", pa.int16()), ("yes", pa.bool_()), ("extra_null", pa.string()),
                       ("absent", pa.int64())])
    got = _same(spark, str(f), "json", table)
    assert got.column("when").to_pylist()[0] == dt.datetime(2024, 1, 1, 18, 4, 5, tzinfo=dt.UTC)
    assert got.column("code").to_pylist() == [7, 12, None]


def test_csv_batch_into_a_table_equals_spark(spark, tmp_path: Path):
    f = tmp_path / "batch.csv"
    f.write_bytes('id, region ,n,big,flag,note,zip\r\n'
                  'a-1,eu west,007,3000000000,TRUE,"x, y",007\r\n'
                  'b/2,"",-5,+1,false, ,10115\r\n'
                  '\r\n'
                  '鍵,亚太 ap,,2,,null,\r\n'.encode())
    table = pa.schema([("id", pa.string()), (" region ", pa.string()), ("n", pa.int64()), ("big", pa.int64()),
                       ("flag", pa.bool_()), ("note", pa.string()), ("zip", pa.string())])
    got = _same(spark, str(f), "csv", table)
    assert got.column("n").to_pylist() == [7, -5, None] and got.column("note").to_pylist() == ["x, y", " ", "null"]
    assert got.column("big").to_pylist() == [3000000000, 1, 2]
    # Spark infers int for an all-digit CSV column, then casts it to the table's string: "007" -> "7"
    assert got.column("zip").to_pylist() == ["7", "10115", None]


def test_casts_to_the_table_types_equal_spark_try_cast(spark, tmp_path: Path):
    """A Parquet batch whose types differ from the table's: every supported pair, castable values."""
    big = 2**62 + 1
    batch = pa.table({
        "l2i": pa.array([1, -2**31, 2**31 - 1, None], pa.int64()),
        "i2l": pa.array([1, -2**31, 2**31 - 1, None], pa.int32()),
        "l2d": pa.array([big, -7, 0, None], pa.int64()),
        "l2f": pa.array([big, 16777217, -1, None], pa.int64()),
        "i2dec": pa.array([99999, -99999, 0, None], pa.int32()),
        "i2s": pa.array([-12, 0, 2**31 - 1, None], pa.int32()),
        "i2b": pa.array([-3, 0, 1, None], pa.int8()),
        "b2i": pa.array([True, False, None, True]),
        "b2s": pa.array([True, False, None, True]),
        "d2i": pa.array([1.9, -1.9, 2147483647.5, float("nan")], pa.float64()),
        "d2l": pa.array([2.0**63, -2.0**63, -0.5, None], pa.float64()),
        "d2t": pa.array([-128.9, 127.9, 0.0, None], pa.float64()),
        "d2f": pa.array([1e40, 0.1, -1e-50, float("inf")], pa.float64()),
        "f2d": pa.array([0.1, None, 3.5, -0.0], pa.float32()),
        "dec2dec": pa.array([Decimal("1.015"), Decimal("-1.015"), Decimal("99.994"), None], pa.decimal128(10, 3)),
        "dec2i": pa.array([Decimal("1.9"), Decimal("-1.9"), Decimal(0), None], pa.decimal128(5, 1)),
        "s2i": pa.array([" 12 ", "+7", "\t-0\n", None]),
        "s2b": pa.array([" T ", "yes", "0", "N"]),
        "s2date": pa.array(["2024-01-02", " 2024-02-29 10:00", "2024-01-02Tjunk", None]),
        "s2ts": pa.array(["2024-01-02T03:04:05.5Z", "2024-01-02 03:04:05-05:30", "2024-01-02", "1969-12-31 23:59:59.9999999"]),
        "s2ntz": pa.array(["2024-01-02T03:04:05+09:00", "2024-01-02 03:04:05.1234567", "2024-01-02", None]),
        "tz2ntz": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 500000, tzinfo=TOKYO), None] * 2, pa.timestamp("ms", "Asia/Tokyo")),
        "ntz2tz": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5), None] * 2, pa.timestamp("us")),
        "date2ts": pa.array([dt.date(2024, 1, 2), dt.date(1969, 12, 31), None, dt.date(1, 1, 1)], pa.date32()),
        "ts2date": pa.array([dt.datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=dt.UTC), None] * 2,
                            pa.timestamp("us", "UTC")),
        "date2s": pa.array([dt.date(2024, 1, 2), None, dt.date(1, 1, 1), dt.date(9999, 12, 31)], pa.date32()),
        "u32": pa.array([0, 2**32 - 1, None, 5], pa.uint32()),
        "ts2s": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 120000, tzinfo=TOKYO), None,
                          dt.datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=dt.UTC), dt.datetime(1, 1, 1, tzinfo=dt.UTC)],
                         pa.timestamp("us", "Asia/Tokyo")),
        "dec2s": pa.array([Decimal("0E-10"), Decimal("1E-8"), None, Decimal("-12.5")], pa.decimal128(20, 10)),
        "ls": pa.array(["a", None, "b", "c"], pa.large_string()),
        "tags": pa.array([[1], None, [], [2, None]], pa.list_(pa.int64())),
        "nulls": pa.nulls(4),
    })
    f = tmp_path / "batch.parquet"
    pq.write_table(batch, f)
    table = pa.schema([
        ("l2i", pa.int32()), ("i2l", pa.int64()), ("l2d", pa.float64()), ("l2f", pa.float32()),
        ("i2dec", pa.decimal128(6, 1)), ("i2s", pa.string()), ("i2b", pa.bool_()), ("b2i", pa.int32()),
        ("b2s", pa.string()), ("d2i", pa.int32()), ("d2l", pa.int64()), ("d2t", pa.int8()), ("d2f", pa.float32()),
        ("f2d", pa.float64()), ("dec2dec", pa.decimal128(4, 2)), ("dec2i", pa.int16()), ("s2i", pa.int32()),
        ("s2b", pa.bool_()), ("s2date", pa.date32()), ("s2ts", pa.timestamp("us", "UTC")), ("s2ntz", pa.timestamp("us")),
        ("tz2ntz", pa.timestamp("us")), ("ntz2tz", pa.timestamp("us", "UTC")), ("date2ts", pa.timestamp("us", "UTC")),
        ("ts2date", pa.date32()), ("date2s", pa.string()), ("u32", pa.int64()), ("ls", pa.string()),
        ("tags", pa.list_(pa.field("element", pa.int64()))), ("nulls", pa.string()), ("absent", pa.date32()),
        ("ts2s", pa.string()), ("dec2s", pa.string()),
    ])
    with pytest.raises(BadInputError, match="'d2i': 1 value"):  # NaN cannot be cast: both paths say so
        _arrow_batch(str(f), "parquet", table)
    pq.write_table(batch.set_column(batch.column_names.index("d2i"), "d2i",
                                    pa.array([1.9, -1.9, 2147483647.5, None], pa.float64())), f)
    got = _same(spark, str(f), "parquet", table)
    assert got.column("dec2dec").to_pylist() == [Decimal("1.02"), Decimal("-1.02"), Decimal("99.99"), None]
    assert got.column("d2l").to_pylist()[0] == 2**63 - 1


@pytest.mark.parametrize(("column", "values", "src", "dst"), [
    ("n", [1, 2**31, -2**31 - 1, None], pa.int64(), pa.int32()),
    ("n", [1.5, float("nan"), 1e300, None], pa.float64(), pa.int64()),
    ("n", ["12", "1.5", "x", ""], pa.string(), pa.int16()),
    ("n", ["yes", "maybe", None, "2"], pa.string(), pa.bool_()),
    ("n", [Decimal("123.45"), Decimal("1.00"), None, Decimal("-999.99")], pa.decimal128(5, 2), pa.decimal128(4, 2)),
    ("n", [300, -129, 5, None], pa.int32(), pa.int8()),
    # longer than CPython's 4,300-digit int text: leading zeros cast (to 1 and -12), only the overflow fails
    ("n", ["0" * 5000 + "1", "9" * 5000, "-" + "0" * 4400 + "12", None], pa.string(), pa.int64()),
])
def test_uncastable_values_fail_with_the_spark_line(spark, tmp_path: Path, column, values, src, dst):
    f = tmp_path / "batch.parquet"
    # the first failing column in table order is named: "a" fails too but comes after "n"
    pq.write_table(pa.table({"a": pa.array([2**40, 1, 1, 1]), column: pa.array(values, src)}), f)
    table = pa.schema([(column, dst), ("a", pa.int32())])
    arrow_msg, spark_msg = _errors(spark, str(f), "parquet", table)
    assert arrow_msg == spark_msg
    assert arrow_msg.startswith(f"column {column!r}: ")


def test_a_glob_source_upserts_its_matches_only_through_spark(spark, tmp_path: Path):
    """The CLI takes a glob as the source (Spark reads it as a Hadoop glob). The pre-check lets a
    glob with matches through and refuses one with none (exit 2, nothing written); ``auto``
    runs it on Spark (the Arrow reader leaves globs to Spark); files the glob does not name stay out."""
    from spark_jobs.engines import precheck_upsert, upsert
    from spark_jobs.table.action.upsert import UpsertOptions
    from spark_jobs.table.reader import read_arrow
    from tests.oracle import reduce_batches
    from tests.spark.conftest import tree_digest, write_batch

    def rows(day: int, keys: list[str]) -> list[dict]:
        return [{"id": k, "ts": day, "region": "eu west/+%ü", "v": f"{k}@{day}", "is_deleted": False} for k in keys]

    land = tmp_path / "landing"
    a1, a2 = rows(1, ["k 1", "k/2", "k%3", "ключ"]), rows(2, ["k/2", "x" * 300])
    b1 = rows(3, ["k 1", "only-in-b"])
    write_batch(land / "a-1.parquet", a1)
    write_batch(land / "a-2.parquet", a2)
    write_batch(land / "b-1.parquet", b1)
    uri = str(tmp_path / "t")

    def opts(source: str, **kw) -> UpsertOptions:
        return UpsertOptions(table=uri, source=source, record_key=["id"], precombine_field="ts",
                             partition_field="region", delete_field="is_deleted", **kw)

    with pytest.raises(BadInputError, match=r"source .*landing/z-\*\.parquet matches no file"):
        precheck_upsert(opts(str(land / "z-*.parquet")))
    with pytest.raises(EngineUnsupportedError, match="glob pattern"):
        upsert(opts(str(land / "a-*.parquet"), engine="arrow"), spark=lambda: pytest.fail("started Spark"))
    assert not (tmp_path / "t").exists()

    glob = opts(str(land / "a-*.parquet"))
    precheck_upsert(glob)
    result = upsert(glob, spark=lambda: spark)
    assert result["engine"] == "spark", result
    want = {k: {c: v for c, v in r.items() if c != "is_deleted"} for k, r in reduce_batches([a1, a2]).items()}
    got = {r["id"]: r for r in read_arrow(uri).select(["id", "ts", "region", "v"]).to_pylist()}
    assert got == want

    before = tree_digest(tmp_path / "t")
    with pytest.raises(BadInputError, match="matches no file"):
        precheck_upsert(opts(str(land / "{c,d}-*.parquet")))
    assert tree_digest(tmp_path / "t") == before
