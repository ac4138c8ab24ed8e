"""The in-process engine from the command line, as users run it: no JVM, no ``pyspark`` import;
the choice and its reason recorded and shown; the crash matrix (SIGKILL at every fault point of
an upsert) ends in the old snapshot or the new one, and the next run repairs, as on Spark."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.engines import upsert_footprint
from spark_jobs.table.action.engine import choose_engine
from spark_jobs.table.action.rollback import rollback
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity

#: users' data: keys and partition values with spaces, /, %, + and non-ASCII; the literal
#: "__NULL__"; a CJK address whose directory name passes 200 bytes (shortened, hashed)
KEY = "k{:03d} /%+é"
SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.int64()),
                    ("amount", pa.decimal128(12, 2)), ("at", pa.timestamp("us", tz="Europe/Lisbon")),
                    ("tags", pa.list_(pa.string())), ("is_deleted", pa.bool_())])
B1 = [{"id": KEY.format(i), "region": ["eu west/1", "sã%o+paulo", None][i % 3], "ts": i,
       "amount": Decimal(i) / 4, "at": dt.datetime(2026, 3, 29, 0, 30, tzinfo=dt.timezone.utc),
       "tags": ["a", None] if i % 2 else None, "is_deleted": False} for i in range(120)]
B2 = [{"id": KEY.format(i), "region": ["__NULL__", "東京都千代田区千代田一丁目一番一号皇居東御苑内" * 3][i % 2],
       "ts": 1000 + i, "amount": Decimal("-1.50"), "at": None, "tags": [], "is_deleted": i % 7 == 0}
      for i in range(60, 180)]
#: a wrapper that fails when the CLI imported pyspark
NO_PYSPARK = ("import sys; from spark_jobs.cli import main; rc = main(sys.argv[1:]); "
              "assert 'pyspark' not in sys.modules, 'pyspark was imported'; sys.exit(rc)")


def _write(path: Path, rows: list[dict]) -> str:
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return str(path)


def _no_java_env(**extra: str) -> dict[str, str]:
    """The environment with no Java reachable: a JVM start would fail the run."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "SPARK_HOME", "SPARK_REMOTE")}
    env["JAVA_HOME"] = "/nonexistent-java"
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not os.path.exists(os.path.join(p, "java")))
    env.update(extra)
    return env


def _cli(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    return subprocess.run([sys.executable, "-c", NO_PYSPARK, *args], capture_output=True, text=True, timeout=120,
                          env=env or _no_java_env(), **kw)


def _upsert_args(uri: str, src: str, batch_id: str) -> list[str]:
    return ["upsert", uri, src, "--record-key", "id", "--precombine-field", "ts", "--partition-field", "region",
            "--delete-field", "is_deleted", "--batch-id", batch_id, "--target-file-rows", "50",
            "--table-type", "merge_on_read"]


def _utc(rows: dict) -> dict:
    return {k: {c: (v.astimezone(dt.timezone.utc) if isinstance(v, dt.datetime) else v) for c, v in r.items()}
            for k, r in rows.items()}


def test_cli_upsert_runs_in_process_without_java_or_pyspark(tmp_path):
    uri = str(tmp_path / "t")
    for i, rows in enumerate([B1, B2]):
        p = _cli(*_upsert_args(uri, _write(tmp_path / f"b{i}.parquet", rows), f"b{i}"))
        assert p.returncode == 0, p.stderr[-3000:]
        assert "engine: arrow (needs about" in p.stderr
        assert json.loads(p.stdout.strip().splitlines()[-1])["engine"] == "arrow"
    assert _utc(rows_by_identity(read_arrow(uri).to_pylist())) == _utc(reduce_batches([B1, B2]))
    assert run_validate(uri)["ok"]
    show = _cli("show", uri)
    assert show.returncode == 0 and "engine=arrow (needs about" in show.stdout, show.stdout
    # a rerun of a committed batch is a no-op, also in-process
    again = _cli(*_upsert_args(uri, str(tmp_path / "b1.parquet"), "b1"))
    assert again.returncode == 0 and json.loads(again.stdout.strip().splitlines()[-1])["noop"]


def test_explicit_arrow_refuses_what_only_spark_runs(tmp_path):
    uri = str(tmp_path / "t")
    src = str(tmp_path / "b.parquet")  # a double key: its text ("1.0E7") only Spark defines
    pq.write_table(pa.table({"id": [1e7, 2.5], "region": ["a b", "c/d"], "ts": [1, 2], "is_deleted": [False, False]}), src)
    p = _cli(*_upsert_args(uri, src, "b"), "--engine", "arrow")
    assert p.returncode == 2, p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith("bucketindex: error: --engine arrow cannot run this batch: column 'id' of type double")
    assert not (tmp_path / "t").exists()
    # --master means Spark: asking for arrow with it is a contradiction, told before anything runs
    p = _cli(*_upsert_args(uri, src, "b"), "--engine", "arrow", "--master", "local[1]")
    assert p.returncode == 2 and "asks for Spark" in p.stderr


def test_the_tee_runs_in_process_and_writes_what_the_plain_upsert_writes(tmp_path):
    """``--shadow-index`` on the Arrow engine: the commit records the comparison (a healthy record
    table: every key agrees), ``show`` prints it, and the table equals one written without the
    tee. (Spark's and Arrow's tee agree key for key: tests/spark/test_shadow_tee.py.)"""
    b1, b2 = _write(tmp_path / "b1.parquet", B1), _write(tmp_path / "b2.parquet", B2)
    for name, tee in (("tee", ["--shadow-index", "global_simple"]), ("plain", [])):
        uri = str(tmp_path / name)
        assert _cli(*_upsert_args(uri, b1, "b1"), "--engine", "arrow").returncode == 0
        p = _cli(*_upsert_args(uri, b2, "b2"), "--engine", "arrow", *tee)
        assert p.returncode == 0, p.stderr[-3000:]
    t, plain = Table.load(str(tmp_path / "tee")), Table.load(str(tmp_path / "plain"))
    assert sorted(map(str, read_arrow(t.uri).to_pylist())) == sorted(map(str, read_arrow(plain.uri).to_pylist()))
    meta = t.timeline.read_metadata(t.timeline.completed(["commit"])[-1])  # (an automatic compaction may follow)
    assert meta["shadow"] == {"shadow_index": "global_simple", "keys_compared": len(B2), "compared": "location",
                              "disagreements": {"missing": 0, "extra": 0, "wrong_location": 0},
                              "samples": {"missing": [], "extra": [], "wrong_location": []}}
    assert "shadow" not in plain.timeline.read_metadata(plain.timeline.completed(["commit"])[-1])
    show = _cli("show", t.uri)
    assert f"shadow global_simple: {len(B2)} keys compared, no disagreements" in show.stdout, show.stdout


def test_auto_sizes_the_batch_and_the_touched_file_groups(tmp_path):
    uri = str(tmp_path / "t")
    src = _write(tmp_path / "b.parquet", B1)
    opts = UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region",
                         delete_field="is_deleted")
    small = upsert_footprint(opts)
    assert small > os.path.getsize(src)  # the batch, decoded
    assert choose_engine(requested="auto", needed_bytes=small, budget=small).engine == "arrow"
    over = choose_engine(requested="auto", needed_bytes=small, budget=small - 1)
    assert over.engine == "spark" and "over the" in over.reason
    run_upsert(opts)
    assert upsert_footprint(opts) > small  # the table's file groups and index buckets count once they exist


def _options(uri: str, src: str, index: str, batch_id: str) -> UpsertOptions:
    return UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region",
                         index=index, num_buckets=4, delete_field="is_deleted", batch_id=batch_id,
                         target_file_rows=50)


@pytest.mark.parametrize(
    "index,table_type,point,repair",
    [
        ("record", "copy_on_write", "after_requested", "rerun"),
        ("record", "copy_on_write", "after_data_file", "rerun"),
        ("record", "copy_on_write", "after_index_file", "rollback"),
        ("record", "merge_on_read", "after_index_file", "rerun"),
        ("record", "copy_on_write", "before_complete", "rerun"),
        ("record", "merge_on_read", "after_conflict_check", "rollback"),
        ("bucket", "merge_on_read", "after_data_file", "rerun"),
        ("bucket", "copy_on_write", "before_complete", "rollback"),
        ("global_simple", "copy_on_write", "after_data_file", "rerun"),
        ("global_simple", "merge_on_read", "after_conflict_check", "rerun"),
    ],
)
def test_killed_arrow_writer_leaves_old_snapshot_and_next_run_repairs(tmp_path, index, table_type, point, repair):
    uri = str(tmp_path / "t")
    run_upsert(UpsertOptions(**{**_options(uri, _write(tmp_path / "b1.parquet", B1), index, "b1").__dict__,
                                "table_type": table_type}))
    before = read_arrow(uri).to_pylist()
    src2 = _write(tmp_path / "b2.parquet", B2)
    args = ["upsert", uri, src2, "--record-key", "id", "--precombine-field", "ts", "--partition-field", "region",
            "--delete-field", "is_deleted", "--batch-id", "b2", "--engine", "arrow"]
    p = subprocess.run([sys.executable, "-m", "spark_jobs.cli", *args], capture_output=True, text=True, timeout=120,
                       env=_no_java_env(BUCKETINDEX_FAULT=point), start_new_session=True)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-2000:])
    t = Table.load(uri)
    pending = t.timeline.pending()
    assert len(pending) == 1 and pending[0].action == "commit"
    assert read_arrow(uri).to_pylist() == before  # readers see the previous snapshot
    if point != "after_requested":
        assert t.marked_files(pending[0].timestamp), "the writer should have left marked files"
    if repair == "rollback":
        assert rollback(t) == [pending[0].timestamp]
        assert read_arrow(uri).to_pylist() == before
    res = run_upsert(_options(uri, src2, index, "b2"))
    assert not res["noop"]
    t = Table.load(uri)
    assert t.timeline.pending() == []
    partition = "region" if index == "bucket" else None
    expected = reduce_batches([B1, B2], partition=partition)
    assert _utc(rows_by_identity(read_arrow(uri).to_pylist(), partition=partition)) == _utc(expected)
    assert run_validate(uri)["ok"]
    on_disk = {str(p.relative_to(tmp_path / "t")) for p in (tmp_path / "t").rglob("*.parquet")
               if ".bucketindex" not in p.parts}
    referenced = set()
    for inst in t.timeline.completed():  # the upserts' and their automatic compactions' files
        for fg in t.timeline.read_metadata(inst).get("file_groups", []):
            referenced |= {fg.get("path"), (fg.get("log") or {}).get("path")}
    assert on_disk <= referenced, on_disk - referenced
