"""Bad input: a one-line reason, exit status 2, and the table byte-for-byte unchanged."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spark_jobs.exceptions import BadInputError
from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
from tests.spark.conftest import tree_digest, write_batch

pytestmark = pytest.mark.spark

GOOD = [{"id": f"k{i}", "region": "eu", "ts": i, "amount": float(i)} for i in range(20)]


@pytest.fixture(scope="module")
def table(spark, tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    uri = str(d / "table")
    run_upsert(spark, UpsertOptions(table=uri, source=write_batch(d / "good.parquet", GOOD), record_key=["id"],
                                    precombine_field="ts", partition_field="region", num_buckets=4))
    return d, uri


def opts(uri: str, src: str, **kw) -> UpsertOptions:
    base = dict(table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region")
    return UpsertOptions(**{**base, **kw})


CASES = {
    "missing key column": ([{"key": "x", "region": "eu", "ts": 1, "amount": 1.0}], {}, "record key field 'id' is not in the source"),
    "null key": ([{"id": None, "region": "eu", "ts": 1, "amount": 1.0}, {"id": "a", "region": "eu", "ts": 1, "amount": 1.0}], {}, "null or empty record key"),
    "empty key": ([{"id": "", "region": "eu", "ts": 1, "amount": 1.0}], {}, "null or empty record key"),
    "uncastable type": ([{"id": "a", "region": "eu", "ts": 1, "amount": "lots"}], {}, "cannot be cast"),
    "index type contradicts": (GOOD[:2], {"index": "bucket"}, "index type bucket contradicts"),
    "bucket count contradicts": (GOOD[:2], {"num_buckets": 8}, "--num-buckets 8 contradicts the table's 4 buckets"),
    "key fields contradict": ([{**r, "id2": "x"} for r in GOOD[:2]], {"record_key": ["id", "id2"]}, "record key id,id2 contradicts"),
    "partition field contradicts": (GOOD[:2], {"partition_field": "id"}, "partition fields id contradicts"),
    "new column": ([{**GOOD[0], "extra": 1}], {}, "not in the table schema"),
    "missing precombine": ([{"id": "a", "region": "eu", "amount": 1.0}], {}, "precombine field 'ts' is not in the source"),
    # it used to null amount on every updated row (issue 22)
    "missing column": ([{"id": "k1", "region": "eu", "ts": 99}, {"id": "new", "region": "eu", "ts": 99}], {},
                       "the batch lacks columns amount that the table has"),
    "missing column, not every row deletes": (
        [{"id": "k1", "region": "eu", "ts": 99, "del": True}, {"id": "k2", "region": "eu", "ts": 99, "del": False}],
        {"delete_field": "del"}, "the batch lacks columns amount that the table has"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_batch_is_rejected_and_nothing_written(spark, table, case):
    d, uri = table
    rows, extra, message = CASES[case]
    src = write_batch(d / f"{case.replace(' ', '_')}.parquet", rows)
    before = tree_digest(d / "table")
    with pytest.raises(BadInputError) as e:
        run_upsert(spark, opts(uri, src, **extra))
    assert message in str(e.value)
    assert "\n" not in str(e.value)
    assert tree_digest(d / "table") == before


def test_batch_of_deletes_may_omit_columns(spark, tmp_path):
    """Deletes carrying only the key, the precombine and the delete field still work (they write no values)."""
    from spark_jobs.table.reader import read_arrow

    uri = str(tmp_path / "table")
    run_upsert(spark, opts(uri, write_batch(tmp_path / "good.parquet", GOOD), num_buckets=2))
    src = write_batch(tmp_path / "del.parquet", [{"id": "k1", "region": "eu", "ts": 99, "del": True},
                                                  {"id": "k2", "region": "eu", "ts": 1, "del": True}])
    run_upsert(spark, opts(uri, src, delete_field="del"))
    got = {r["id"]: r["amount"] for r in read_arrow(uri).to_pylist()}
    assert got == {r["id"]: r["amount"] for r in GOOD if r["id"] != "k1"}  # k2's delete is older than k2: stale


def test_cli_refuses_missing_column_before_spark(table, monkeypatch, capsys):
    """The CLI tells a batch lacking a column from its Parquet footer: exit 2, one line, no JVM."""
    from spark_jobs import cli

    d, uri = table
    src = write_batch(d / "cli_missing.parquet", [{"id": "k1", "region": "eu", "ts": 99}])
    monkeypatch.setattr(cli, "_spark", lambda *a, **k: pytest.fail("started Spark for a batch lacking a column"))
    before = tree_digest(d / "table")
    rc = cli.main(["upsert", uri, src, "--record-key", "id", "--precombine-field", "ts", "--partition-field", "region"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "the batch lacks columns amount that the table has" in err[0], err
    assert tree_digest(d / "table") == before


def test_empty_batch(spark, table):
    import pyarrow as pa

    d, uri = table
    src = write_batch(d / "empty.parquet", [], schema=pa.schema([("id", pa.string()), ("region", pa.string()),
                                                                  ("ts", pa.int64()), ("amount", pa.float64())]))
    before = tree_digest(d / "table")
    with pytest.raises(BadInputError, match="is empty"):
        run_upsert(spark, opts(uri, src))
    assert tree_digest(d / "table") == before


def test_missing_source_path(spark, table):
    d, uri = table
    before = tree_digest(d / "table")
    with pytest.raises(BadInputError, match="does not exist"):
        run_upsert(spark, opts(uri, str(d / "nope.parquet")))
    assert tree_digest(d / "table") == before


def test_new_table_not_created_on_bad_input(spark, tmp_path):
    src = write_batch(tmp_path / "b.parquet", [{"id": None, "ts": 1}])
    with pytest.raises(BadInputError):
        run_upsert(spark, UpsertOptions(table=str(tmp_path / "t"), source=src, record_key=["id"]))
    assert not (tmp_path / "t").exists()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spark_jobs.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("case", ["missing source", "null key"])
def test_cli_exit_2_with_one_line(table, case):
    d, uri = table
    if case == "missing source":
        src = str(d / "missing.parquet")
    else:
        src = write_batch(d / "cli_null.parquet", [{"id": None, "region": "eu", "ts": 1, "amount": 1.0}])
    before = tree_digest(d / "table")
    p = _cli("upsert", uri, src, "--record-key", "id", "--precombine-field", "ts", "--partition-field", "region")
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bucketindex: error: "), p.stderr
    assert tree_digest(d / "table") == before


def test_cli_usage_error_exits_2():
    p = _cli("upsert", "/tmp/x")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith("bucketindex: error:")
