"""Every Spark verb on a table in S3 with sources in S3, on a Spark without Hadoop's S3 connector.

PySpark ships no ``hadoop-aws``: ``s3a://`` is not a filesystem its JVM can open. So these tests
are the proof that no verb hands an S3 path to Spark's own reader or writer (that would fail with
``ClassNotFoundException: org.apache.hadoop.fs.s3a.S3AFileSystem``): sources and table files are
read by pyarrow inside Spark tasks (``spark_jobs.jobs.hadoop_fs``), and ``read --output`` writes
its one Parquet file from a task. Each chain runs the verbs in order on one table (a few rows,
keys and partition values with spaces, ``/``, ``%``, ``+`` and non-ASCII letters, nulls), and
after each step compares the table with the batches reduced by key (``tests/oracle.py``) and
runs ``validate``.
"""

from __future__ import annotations

import json
import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs import cli
from spark_jobs.io.filesystem import resolve
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity
from tests.spark.conftest import spark  # noqa: F401 - the one session of the run (getOrCreate)

pytestmark = pytest.mark.spark

REGIONS = ["são paulo", "a/b", "50%", "x+y"]
KEYS = ["a b", "x/y", "p%q", "m+n", "ünï", "plain", "k=7"]
SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.int64()), ("amount", pa.float64()),
                    ("is_deleted", pa.bool_())])
SPARK = ["--engine", "spark"]
UPSERT = ["--record-key", "id", "--precombine-field", "ts", "--partition-field", "region",
          "--delete-field", "is_deleted", "--num-buckets", "4"]


def _row(key: str, region: str, ts: int, amount: float | None, deleted: bool = False) -> dict:
    return {"id": key, "region": region, "ts": ts, "amount": amount, "is_deleted": deleted}


BATCH1 = [_row(k, REGIONS[i % len(REGIONS)], 1, None if i == 2 else float(i)) for i, k in enumerate(KEYS)]
BATCH2 = [
    _row("a b", "x+y", 2, 10.5),  # moves partition under a newer precombine value
    _row("x/y", "são paulo", 3, 11.0), _row("x/y", "50%", 2, 12.0),  # in-batch duplicates: ts 3 wins, and moves
    _row("p%q", "a/b", 0, 99.0),  # stale (ts 0 < 1): ignored, stays in 50%
    _row("m+n", "x+y", 2, None, True),  # deleted
    _row("new ü", "a/b", 2, 7.0),  # inserted
]
BATCH3 = [_row("ünï", "50%", 5, 1.0), _row("m+n", "a/b", 6, 2.0), _row("plain", "plain", 4, None)]


def _escape(value: str) -> str:
    """A Hive directory name's value as Spark writes it (``escapePathName``'s common characters)."""
    return "".join(f"%{ord(c):02X}" if c in '%/=:#?*"\'\\[]{}^' else c for c in value)


def _put(uri: str, rows: list[dict], schema: pa.Schema = SCHEMA) -> None:
    io, path = resolve(uri)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, filesystem=io.fs)


def _upload_flat(prefix: str, rows: list[dict]) -> str:
    """Two Parquet files in one directory."""
    _put(f"{prefix}/part-0.parquet", rows[: len(rows) // 2])
    _put(f"{prefix}/part-1.parquet", rows[len(rows) // 2:])
    io, path = resolve(f"{prefix}/_SUCCESS")
    io.write_bytes(path, b"")  # not Parquet, and hidden from Spark's listing (so from ours)
    return prefix


def _upload_hive(prefix: str, rows: list[dict]) -> str:
    """One directory per region (``region=<escaped>``), the files without the region column."""
    data = pa.schema([f for f in SCHEMA if f.name != "region"])
    for region in sorted({r["region"] for r in rows}):
        part = [{k: v for k, v in r.items() if k != "region"} for r in rows if r["region"] == region]
        _put(f"{prefix}/region={_escape(region)}/part-0.parquet", part, data)
    return prefix


def _run(*argv: str) -> int:
    """The CLI in this process: Spark verbs on the run's session (as under spark-submit)."""
    return cli.main(list(argv), submitted="arrow" not in argv)


def _snapshot(table: str, out: str, *, as_of: str | None = None) -> dict:
    """The table through ``read --output`` on Spark: one Parquet file on S3, read back by pyarrow."""
    assert _run("read", table, "--output", out, *SPARK, *(["--as-of", as_of] if as_of else [])) == 0
    io, path = resolve(out)
    assert io.fs.get_file_info(path).type.name == "File"  # one file, not a directory of parts
    with io.open_input_file(path) as f:
        rows = pq.read_table(f).to_pylist()
    return rows_by_identity(rows)


def _expected(*batches: list[dict]) -> dict:
    return reduce_batches(batches)


def _check(table: str, *batches: list[dict]) -> None:
    """The table equals the oracle and is valid, checked in this process (pyarrow, the Arrow
    engine's validate): the Spark verbs under test each run once per chain, the checks between
    them need no Spark jobs."""
    from spark_jobs.table.reader import read_arrow

    assert rows_by_identity(read_arrow(table).to_pylist()) == _expected(*batches)
    assert _run("validate", table, "--engine", "arrow") == 0


def _last_instant(table: str) -> str:
    t = Table.load(table)
    return t.timeline.reload().completed()[-1].timestamp


def test_copy_on_write_chain(spark, bucket, capsys):  # noqa: F811
    """upsert (flat dir, then Hive dirs: a partition move under the precombine field) -> read,
    read --output, read --as-of -> validate -> shadow-compare, each on Spark. ``clean`` and
    ``rollback`` run no engine: tests/s3/test_verbs_arrow_s3.py and test_crash_s3.py run them on S3."""
    table = f"{bucket}/orders cow"
    src1 = _upload_flat(f"{bucket}/landing/b1", BATCH1)
    src2 = _upload_hive(f"{bucket}/landing/b2", BATCH2)
    assert _run("upsert", table, src1, *UPSERT, "--batch-id", "b1", *SPARK) == 0
    first = _last_instant(table)
    assert _run("upsert", table, src2, *UPSERT, "--batch-id", "b2", *SPARK) == 0
    _check(table, BATCH1, BATCH2)
    assert _snapshot(table, f"{bucket}/out.parquet") == _expected(BATCH1, BATCH2)
    assert _snapshot(table, f"{bucket}/then.parquet", as_of=first) == _expected(BATCH1)

    capsys.readouterr()
    assert _run("read", table, *SPARK) == 0  # printed by Spark's show(): every live key
    shown = capsys.readouterr().out
    assert all(k in shown for k in _expected(BATCH1, BATCH2)) and "m+n" not in shown

    assert _run("validate", table, *SPARK) == 0
    capsys.readouterr()
    assert _run("shadow-compare", table, *SPARK) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["mismatches"] == 0, report


def test_merge_on_read_chain(spark, bucket, capsys):  # noqa: F811
    """upsert x3 on merge-on-read (flat, Hive dirs with a partition move, flat) -> read ->
    compact --schedule-only, --execute --data -> rehash 4 -> 8 -> 4 -> read, validate."""
    table = f"{bucket}/orders mor"
    src1 = _upload_flat(f"{bucket}/landing/b1", BATCH1)
    src2 = _upload_hive(f"{bucket}/landing/b2", BATCH2)
    _upload_flat(f"{bucket}/landing/b3", BATCH3)
    mor = [*UPSERT, "--table-type", "merge_on_read", "--auto-compact", "off"]  # compacted below, when asked
    assert _run("upsert", table, src1, *mor, "--batch-id", "b1", *SPARK) == 0
    assert _run("upsert", table, src2, *mor, "--batch-id", "b2", *SPARK) == 0
    assert _run("upsert", table, f"{bucket}/landing/b3", *mor, "--batch-id", "b3", *SPARK) == 0
    view = Table.load(table).view()
    assert any(s.logs for s in view.slices()), "no merge-on-read log was written"
    _check(table, BATCH1, BATCH2, BATCH3)
    assert _snapshot(table, f"{bucket}/out.parquet") == _expected(BATCH1, BATCH2, BATCH3)  # logs merged

    capsys.readouterr()
    assert _run("compact", table, "--schedule-only", "--min-logs", "1", "--min-deltas", "1", *SPARK) == 0
    planned = capsys.readouterr().out.strip().splitlines()[-1].strip()
    assert _run("compact", table, "--execute", planned, *SPARK) == 0
    assert not any(s.logs for s in Table.load(table).view().slices())
    _check(table, BATCH1, BATCH2, BATCH3)

    for n in (8, 4):
        assert _run("rehash", table, "--num-buckets", str(n)) == 0
        assert Table.load(table).num_buckets(Table.load(table).view()) == n
    _check(table, BATCH1, BATCH2, BATCH3)
    assert _run("validate", table, *SPARK) == 0


@pytest.mark.parametrize("mode", ["reference", "rewrite"])
def test_bootstrap_from_an_s3_hive_dataset(spark, bucket, mode):  # noqa: F811
    """A Hive-partitioned Parquet dataset on S3 becomes a table (its files in place, or rewritten),
    which then takes an upsert from S3 moving a key across partitions."""
    dataset = _upload_hive(f"{bucket}/dataset", [{k: v for k, v in r.items()} for r in BATCH1])
    table = f"{bucket}/boot-{mode}"
    args = ["--record-key", "id", "--precombine-field", "ts", "--partition-field", "region", "--mode", mode]
    if mode == "rewrite":
        args += ["--index", "bucket"]
    assert _run("bootstrap", table, dataset, *args) == 0
    base = [{**r, "is_deleted": False} for r in BATCH1]
    # the dataset's rows hold no delete flag; the oracle's rows do not either
    want = {k: {c: v for c, v in r.items() if c != "is_deleted"} for k, r in _expected(base).items()}
    from spark_jobs.table.reader import read_arrow

    got = rows_by_identity(read_arrow(table).to_pylist())
    assert {k: {c: r[c] for c in ("id", "region", "ts", "amount")} for k, r in got.items()} == \
           {k: {c: r[c] for c in ("id", "region", "ts", "amount")} for k, r in want.items()}
    assert _run("validate", table, "--engine", "arrow") == 0


def test_corrupt_s3_source_file_is_bad_input_naming_it(spark, bucket, capsys):  # noqa: F811
    """A junk file among the source's Parquet files: exit 2, one line naming it, nothing written."""
    src = _upload_flat(f"{bucket}/landing/bad", BATCH1)
    io, path = resolve(f"{src}/part-9.parquet")
    io.write_bytes(path, b"not parquet at all")
    table = f"{bucket}/t"
    capsys.readouterr()
    assert _run("upsert", table, src, *UPSERT, *SPARK) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "part-9.parquet" in err[0] and "corrupt" in err[0], err
    assert not resolve(table)[0].exists(resolve(table)[1] + "/.bucketindex/table.json")


def test_unreachable_source_store_is_not_bad_input(spark, bucket, capsys):  # noqa: F811
    """The source's endpoint is a closed port (a URI option: the table's store answers): retryable
    or an environment problem, never bad input."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = f"{bucket}/landing/b1/part-0.parquet?endpoint_url=http://127.0.0.1:{port}"
    capsys.readouterr()
    code = _run("upsert", f"{bucket}/t", src, *UPSERT, *SPARK)
    err = capsys.readouterr().err.strip().splitlines()
    assert code in (1, 3), err
    assert len(err) == 1, err
    # the Spark job's own source reader, past the CLI's pre-check: retryable too
    from spark_jobs.exceptions import StorageUnavailableError
    from spark_jobs.jobs.source import read_source

    with pytest.raises(StorageUnavailableError):
        read_source(spark, src, "parquet")


def test_spark_session_has_no_s3_connector(spark):  # noqa: F811
    """What makes the tests above the proof: this Spark cannot open s3a:// itself."""
    from spark_jobs.jobs.hadoop_fs import hadoop_reads

    assert not hadoop_reads(spark, "s3://bucket/x")
    assert hadoop_reads(spark, "/tmp/x")


def test_glob_and_hive_source_read_as_spark_reads_them(spark, bucket):  # noqa: F811
    """A glob over Hive directories and a Hive dataset: the rows, and the schema Spark's own
    reader gives (data columns in the files' order, then the partition column, typed)."""
    from spark_jobs.jobs.source import read_source

    _upload_hive(f"{bucket}/landing/h", BATCH1)
    df = read_source(spark, f"{bucket}/landing/h", "parquet")
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("id", "string"), ("ts", "bigint"), ("amount", "double"), ("is_deleted", "boolean"), ("region", "string")]
    assert sorted(tuple(r) for r in df.select("id", "region", "amount").collect()) == \
        sorted((r["id"], r["region"], r["amount"]) for r in BATCH1)
    globbed = read_source(spark, f"{bucket}/landing/h/region={{a%2Fb,x+y}}/*.parquet", "parquet")
    want = sorted(r["id"] for r in BATCH1 if r["region"] in ("a/b", "x+y"))
    assert sorted(r["id"] for r in globbed.collect()) == want


def test_json_source_on_s3_reads_as_the_arrow_engine_does(spark, bucket, capsys):  # noqa: F811
    """JSON lines on S3: read by the reader the Arrow engine uses (its inference) for an existing
    table; a new table's schema from JSON is Spark's own inference: the connector is named (exit 1),
    never bad input."""
    from spark_jobs.exceptions import MissingDependencyError
    from spark_jobs.jobs.source import read_source

    io, path = resolve(f"{bucket}/landing/j/part-0.json")
    io.write_bytes(path, b"".join(json.dumps(r).encode() + b"\n" for r in BATCH1))
    df = read_source(spark, f"{bucket}/landing/j", "json", table_schema=SCHEMA)
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("amount", "double"), ("id", "string"), ("is_deleted", "boolean"), ("region", "string"), ("ts", "bigint")]
    assert sorted(r["id"] for r in df.collect()) == sorted(KEYS)
    with pytest.raises(MissingDependencyError, match="hadoop-aws"):
        read_source(spark, f"{bucket}/landing/j", "json")
    capsys.readouterr()
    assert _run("upsert", f"{bucket}/new", f"{bucket}/landing/j", "--source-format", "json", *UPSERT, *SPARK) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hadoop-aws" in err[0], err


def test_a_jvm_error_for_a_missing_hadoop_filesystem_is_one_line_exit_1():
    """Wherever Spark's own reader still meets s3a:// without the connector, the CLI names it."""
    import argparse

    text = ("An error occurred while calling o51.parquet.\n: java.lang.RuntimeException: "
            "java.lang.ClassNotFoundException: Class org.apache.hadoop.fs.s3a.S3AFileSystem not found\n\tat ...")
    status, line = cli._told_apart(argparse.Namespace(verb="read", table=None), RuntimeError(text))
    assert status == 1 and "hadoop-aws" in line and "\n" not in line
