"""The CLI a newcomer meets (issue 24, item 4), on the in-process engine.

* options the table fixes (key, partition field, precombine field, index, table type, buckets)
  are read from ``table.json`` once it exists, and only checked when given;
* a check that needs only metadata answers before any JVM starts: a contradicting option under
  ``--engine spark`` returns exit 2 in under 2 s, and no ``java`` was ever run (a fake ``java``
  first on PATH and as ``$JAVA_HOME/bin/java`` records any invocation);
* without ``--batch-id`` a rerun of the same command on unchanged files is a no-op, and a changed
  source is a new batch;
* ``rows_in_batch`` counts the rows read, ``keys_in_batch`` the keys after dedupe.

Real Parquet, real tables, the CLI as a subprocess; the Spark side of the counts is in
``tests/spark/test_cli_newcomer_spark.py``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import resource
import stat
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.table.table import Table

pytestmark = pytest.mark.unit

TZ = dt.timezone(dt.timedelta(hours=5, minutes=30))
SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("amount", pa.decimal128(9, 2)), ("note", pa.string()), ("is_deleted", pa.bool_())])


def _t(h: int) -> dt.datetime:
    return dt.datetime(2024, 3, 10, h, 0, tzinfo=TZ)


def rows_1() -> list[dict]:
    return [
        {"id": "a b", "region": "eu west", "ts": _t(1), "amount": Decimal("1.50"), "note": None, "is_deleted": False},
        {"id": "c/d", "region": "us/east", "ts": _t(1), "amount": Decimal("2.00"), "note": "x", "is_deleted": False},
        {"id": "50%+", "region": None, "ts": _t(1), "amount": None, "note": "ü", "is_deleted": False},
        {"id": "Zoë", "region": "eu west", "ts": _t(1), "amount": Decimal("4.00"), "note": None, "is_deleted": False},
    ]


def rows_2() -> list[dict]:
    """Updates (one key twice: the later ts wins), a delete, an insert: 5 rows, 4 keys."""
    return [
        {"id": "a b", "region": "eu west", "ts": _t(2), "amount": Decimal("9.00"), "note": "old", "is_deleted": False},
        {"id": "a b", "region": "eu west", "ts": _t(3), "amount": Decimal("9.50"), "note": "new", "is_deleted": False},
        {"id": "c/d", "region": "us/east", "ts": _t(2), "amount": None, "note": None, "is_deleted": True},
        {"id": "Zoë", "region": "eu west", "ts": _t(0), "amount": Decimal("0.01"), "note": "stale", "is_deleted": False},
        {"id": "e€", "region": "ap south", "ts": _t(2), "amount": Decimal("5.25"), "note": None, "is_deleted": False},
    ]


def _write(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return str(path)


def oracle(*batches: list[dict]) -> dict[str, dict]:
    """The batches reduced by key: the highest ts wins (a tie: the later row), a delete drops the key."""
    best: dict[str, dict] = {}
    for batch in batches:
        for r in batch:
            if r["id"] not in best or r["ts"] >= best[r["id"]]["ts"]:
                best[r["id"]] = r
    return {k: {c: v for c, v in r.items() if c != "is_deleted"} for k, r in best.items() if not r["is_deleted"]}


def snapshot(uri: str) -> dict[str, dict]:
    from spark_jobs.table.reader import read_arrow

    return {r["id"]: {c: r[c] for c in ("id", "region", "ts", "amount", "note")} for r in read_arrow(uri).to_pylist()}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE",)}
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spark_jobs.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env or _env())


def result(p: subprocess.CompletedProcess) -> dict:
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def commits(uri: str) -> list[dict]:
    t = Table.open(uri)
    tl = t.timeline.reload()
    return [tl.read_metadata(i) for i in tl.completed()]


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


#: copy-on-write: these tests count what each batch changed exactly, stale rows included (a
#: merge-on-read write drops a stale update only where it reads the stored row; README, "Table types")
CREATE = ("--record-key", "id", "--precombine-field", "ts", "--partition-field", "region", "--delete-field",
          "is_deleted", "--engine", "arrow", "--table-type", "copy_on_write")


@pytest.fixture()
def table(tmp_path: Path) -> tuple[Path, str]:
    """A record-index table made by the CLI from ``rows_1``."""
    uri = str(tmp_path / "t")
    result(cli("upsert", uri, _write(tmp_path / "in" / "b1" / "part-0.parquet", rows_1()), *CREATE))
    return tmp_path, uri


def test_upsert_without_the_tables_options_uses_the_tables(table):
    d, uri = table
    src = _write(d / "in" / "b2" / "part-0.parquet", rows_2())
    out = result(cli("upsert", uri, src, "--delete-field", "is_deleted", "--engine", "arrow"))
    assert out["counts"]["updated"] == 1 and out["counts"]["deleted"] == 1 and out["counts"]["inserted"] == 1
    assert snapshot(uri) == oracle(rows_1(), rows_2())  # "Zoë" at ts 0 lost to the stored ts 1 (the table's precombine field): not updated
    # the options given again, equal to the table's, are accepted
    src3 = _write(d / "in" / "b3" / "part-0.parquet", rows_1()[:1])
    result(cli("upsert", uri, src3, *CREATE[:8], "--index", "record", "--table-type", "copy_on_write",
               "--num-buckets", "16", "--engine", "arrow"))
    assert snapshot(uri) == oracle(rows_1(), rows_2(), rows_1()[:1])
    check = cli("validate", uri, "--engine", "arrow")
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_new_table_needs_a_record_key(tmp_path: Path):
    src = _write(tmp_path / "b.parquet", rows_1())
    p = cli("upsert", str(tmp_path / "t"), src, "--precombine-field", "ts", "--engine", "arrow")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"bucketindex: error: --record-key is required: the table {tmp_path / 't'} does not exist yet and its "
        f"first upsert fixes the key (later upserts read it from the table)"]
    assert not (tmp_path / "t").exists()


def _fake_java(d: Path) -> tuple[dict[str, str], Path]:
    """An environment whose only ``java`` (PATH and $JAVA_HOME) records that it ran, then fails."""
    marker = d / "java-was-started"
    home = d / "fake-jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho \"$@\" >> '{marker}'\nexit 1\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    env = _env(JAVA_HOME=str(home), PATH=f"{home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("SPARK_HOME", None)
    return env, marker


REFUSED = [
    (("--index", "bucket"), "index type bucket contradicts the table's index type record"),
    (("--table-type", "merge_on_read"), "table type merge_on_read contradicts the table's table type copy_on_write"),
    (("--record-key", "note"), "record key note contradicts the table's record key id"),
    (("--partition-field", "note"), "partition fields note contradicts the table's partition fields region"),
    (("--precombine-field", "amount"), "precombine field amount contradicts the table's precombine field ts"),
    (("--num-buckets", "64"), "--num-buckets 64 contradicts the table's 16 buckets"),
    (("--delete-field", "gone"), "delete field 'gone' is not in the source"),
    (("--extra-column",), "source columns extra are not in the table schema"),
]


def _child_cpu_s() -> float:
    """CPU seconds of this process's finished children: what a refusal costs, which -- unlike
    its wall-clock time -- does not grow when other work shares the machine's two cores."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@pytest.mark.parametrize("given,message", REFUSED, ids=[g[0] for g, _ in REFUSED])
def test_a_metadata_only_refusal_answers_in_under_2s_without_a_jvm(table, given, message):
    d, uri = table
    rows = rows_2()
    if given == ("--extra-column",):
        rows, given = [{**r, "extra": 1} for r in rows], ("--delete-field", "is_deleted")
        schema = SCHEMA.append(pa.field("extra", pa.int64()))
        src = str(d / "in" / "wide.parquet")
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), src)
    else:
        src = _write(d / "in" / "b2" / "part-0.parquet", rows)
    env, marker = _fake_java(d)
    before = tree_digest(Path(uri))
    started = _child_cpu_s()
    p = cli("upsert", uri, src, *given, "--engine", "spark", env=env)
    elapsed = _child_cpu_s() - started
    assert p.returncode == 2, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bucketindex: error: ") and message in lines[0], p.stderr
    assert not marker.exists(), f"a JVM was started: {marker.read_text()}"
    assert elapsed < 2.0, f"the refusal took {elapsed:.2f} s of CPU"
    assert tree_digest(Path(uri)) == before


def test_a_new_table_without_a_key_is_refused_before_a_jvm(tmp_path: Path):
    env, marker = _fake_java(tmp_path)
    started = _child_cpu_s()
    p = cli("upsert", str(tmp_path / "t"), _write(tmp_path / "b.parquet", rows_1()), "--engine", "spark", env=env)
    assert p.returncode == 2 and "--record-key is required" in p.stderr
    assert _child_cpu_s() - started < 2.0 and not marker.exists() and not (tmp_path / "t").exists()


def test_a_rerun_without_batch_id_is_a_noop_and_a_changed_source_is_a_new_batch(table):
    d, uri = table
    src_dir = d / "in" / "b2"
    _write(src_dir / "part-0.parquet", rows_2())
    args = ("upsert", uri, str(src_dir), "--delete-field", "is_deleted", "--engine", "arrow")
    first = cli(*args)
    out = result(first)
    assert out["noop"] is False and out["batch_id"].startswith("auto-") and len(out["batch_id"]) == 25
    assert f"batch id {out['batch_id']}" in first.stderr  # logged
    again = result(cli(*args))
    assert again["noop"] is True and again["batch_id"] == out["batch_id"] and again["instant"] == out["instant"]
    assert [c["batch_id"] for c in commits(uri)].count(out["batch_id"]) == 1
    assert len(commits(uri)) == 2  # the table's first commit and this one
    assert snapshot(uri) == oracle(rows_1(), rows_2())
    # a metadata file Spark and Arrow skip does not make a new batch
    (src_dir / "_SUCCESS").write_text("")
    assert result(cli(*args))["noop"] is True
    # a file added to the source: a new batch, applied
    extra = [{**rows_1()[0], "id": "new one", "ts": _t(5)}]
    _write(src_dir / "part-1.parquet", extra)
    third = result(cli(*args))
    assert third["noop"] is False and third["batch_id"] != out["batch_id"]
    assert third["counts"]["inserted"] == 1
    assert len(commits(uri)) == 3
    # the same files with another delete field reading: another batch id (nothing else changed)
    from spark_jobs.table.action.batch_id import default_batch_id
    from spark_jobs.table.action.upsert import UpsertOptions

    a = default_batch_id(UpsertOptions(table=uri, source=str(src_dir), delete_field="is_deleted"))
    assert a == third["batch_id"]
    assert default_batch_id(UpsertOptions(table=uri, source=str(src_dir))) != a
    assert snapshot(uri) == oracle(rows_1(), rows_2(), extra)


def test_rows_in_batch_counts_rows_and_keys_in_batch_counts_keys(table):
    d, uri = table
    out = result(cli("upsert", uri, _write(d / "in" / "b2" / "part-0.parquet", rows_2()), "--delete-field",
                     "is_deleted", "--engine", "arrow"))
    assert out["counts"]["rows_in_batch"] == 5 and out["counts"]["keys_in_batch"] == 4
    assert commits(uri)[-1]["counts"] == out["counts"]
    first = commits(uri)[0]["counts"]
    assert first["rows_in_batch"] == first["keys_in_batch"] == 4
    shown = cli("show", uri)
    assert shown.returncode == 0, shown.stderr
    assert f"batch={out['batch_id']}" in shown.stdout
    line = next(ln for ln in shown.stdout.splitlines() if f"batch={out['batch_id']}" in ln)
    assert " of 5 rows, 4 keys" in line, line


# -- the Airflow upsert operator: record_key optional too ----------------------------------------------


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox

    sandbox.isolate_before_import()
    from airflow_provider_bucketindex import operators

    return operators


class _TI:
    #: the real task instance's metric tags (ResumableJobMixin reads them)
    stats_tags: dict[str, str] = {}

    def __init__(self, run_id: str) -> None:
        self.dag_id, self.run_id, self.task_id, self.map_index, self.try_number = "ingest", run_id, "upsert", -1, 1
        self.pushed: dict[str, object] = {}

    def xcom_push(self, key, value):  # type: ignore[no-untyped-def]
        self.pushed[key] = value


def test_the_upsert_operator_reads_the_key_from_the_table_and_refuses_contradictions_before_submitting(
        ops, table, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook

    submitted: list = []
    monkeypatch.setattr(BucketIndexHook, "submit", lambda self, verb, args, **kw: submitted.append(args))
    monkeypatch.delenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", raising=False)
    d, uri = table
    src = _write(d / "in" / "b2" / "part-0.parquet", rows_2())
    out = ops.UpsertWithIndexOperator(task_id="upsert", table_uri=uri, source_uri=src,
                                      delete_field="is_deleted").execute({"ti": _TI("r1")})
    assert out["engine"] == "arrow" and (out["updated"], out["deleted"], out["inserted"]) == (1, 1, 1)
    assert snapshot(uri) == oracle(rows_1(), rows_2())
    op = ops.UpsertWithIndexOperator(task_id="upsert", table_uri=uri, source_uri=src, engine="spark")
    assert "--record-key" not in op.spark_submit_command("b")
    before = tree_digest(Path(uri))
    with pytest.raises(AirflowFailException, match="index type bucket contradicts the table's index type record"):
        ops.UpsertWithIndexOperator(task_id="upsert", table_uri=uri, source_uri=src, index="bucket",
                                    engine="spark").execute({"ti": _TI("r2")})
    assert submitted == [] and tree_digest(Path(uri)) == before
    with pytest.raises(AirflowFailException, match="--record-key is required"):
        ops.UpsertWithIndexOperator(task_id="upsert", table_uri=str(d / "new"), source_uri=src,
                                    engine="spark").execute({"ti": _TI("r3")})
    assert submitted == [] and not (d / "new").exists()


# -- --delete-field: what its help says it accepts ------------------------------------------------------

DELETE_VALUES = [  # (type, values of the 5 rows' delete field, which rows delete)
    (pa.string(), ["yes", " NO ", "T", "0", None], [True, False, True, False, False]),
    (pa.int32(), [1, 0, -7, None, 2], [True, False, True, False, True]),
    (pa.bool_(), [True, False, None, True, False], [True, False, False, True, False]),
]


def delete_batch(d: Path, name: str, kind: pa.DataType, values: list) -> str:
    """Five keys stored first, then this batch naming all five with ``flag`` as the delete field."""
    path = d / f"{name}.parquet"
    pq.write_table(pa.table({"id": pa.array(["a b", "c/d", "50%+", "Zoë", "e€"]), "v": pa.array([1, 2, 3, 4, 5]),
                             "flag": pa.array(values, kind)}), path)
    return str(path)


@pytest.mark.parametrize("kind,values,deletes", DELETE_VALUES, ids=["string", "int", "boolean"])
def test_the_delete_field_takes_booleans_integers_and_boolean_strings(tmp_path: Path, kind, values, deletes):
    from spark_jobs.arrow_engine.upsert import run_upsert
    from spark_jobs.table.action.upsert import UpsertOptions

    uri = str(tmp_path / "t")
    base = tmp_path / "base.parquet"
    pq.write_table(pa.table({"id": ["a b", "c/d", "50%+", "Zoë", "e€"], "v": [0, 0, 0, 0, 0]}), base)
    run_upsert(UpsertOptions(table=uri, source=str(base), record_key=["id"], batch_id="base"))
    out = run_upsert(UpsertOptions(table=uri, source=delete_batch(tmp_path, "b", kind, values), delete_field="flag",
                                   batch_id="b"))
    assert out["counts"]["deleted"] == sum(deletes)
    from spark_jobs.table.reader import read_arrow

    left = sorted(r["id"] for r in read_arrow(uri).to_pylist())
    assert left == sorted(k for k, d in zip(["a b", "c/d", "50%+", "Zoë", "e€"], deletes) if not d)


def test_a_delete_string_that_is_not_a_boolean_is_refused_naming_the_smallest(tmp_path: Path):
    src = delete_batch(tmp_path, "b", pa.string(), ["yes", "nope", None, "maybe", "0"])
    p = cli("upsert", str(tmp_path / "t"), src, "--record-key", "id", "--delete-field", "flag", "--engine", "arrow")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["bucketindex: error: delete field 'flag' holds 'maybe', which is not a "
                                             "boolean (true/false, t/f, yes/no, y/n, 1/0)"]
    assert not (tmp_path / "t").exists()
