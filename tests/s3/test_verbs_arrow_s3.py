"""Every verb of the Arrow engine (``--engine arrow``, no JVM) on an S3 table with an S3 source.

One chained scenario, each step against the oracle (tests/oracle.py) and ``validate``: two
upserts on each table type from Parquet uploaded into the bucket (keys and partition values with
spaces, ``/``, ``%``, ``+``, non-ASCII, a null partition; a precombine field, deletes, late events,
and keys moving to another partition), ``read`` printed, to a local and to an S3 ``--output``
and ``--as-of`` the first commit; ``validate``; ``compact --schedule-only``, ``rollback`` of that
plan, scheduled again and ``--execute``d (the logs and the index deltas); ``clean``;
``shadow-compare``; ``show`` -- those on merge-on-read, whose snapshot merges logs. The Spark
engine's twin is tests/s3/test_verbs_spark_s3.py.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.cli import main as cli
from spark_jobs.io.filesystem import resolve
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity

REGIONS = ["eu west/1", "sã%o+paulo", None, "東京 +%"]
KEY = "k{:02d} /%+é"
#: 16 keys in 4 partitions (one of them null)
B1 = [{"id": KEY.format(i), "region": REGIONS[i % 4], "ts": 10 + i, "amount": float(i) if i % 5 else None,
       "is_deleted": False} for i in range(16)]
#: updates that move keys to the next partition, late events (older ts: ignored), deletes, inserts
B2 = ([{"id": KEY.format(i), "region": REGIONS[(i + 1) % 4], "ts": 100 + i, "amount": -float(i),
        "is_deleted": False} for i in range(0, 8)]
      + [{"id": KEY.format(i), "region": REGIONS[(i + 2) % 4], "ts": 1, "amount": 999.0, "is_deleted": False}
         for i in range(8, 10)]
      + [{"id": KEY.format(i), "region": REGIONS[i % 4], "ts": 100 + i, "amount": None, "is_deleted": True}
         for i in range(10, 13)]
      + [{"id": KEY.format(i), "region": REGIONS[i % 4], "ts": 100 + i, "amount": 0.5, "is_deleted": False}
         for i in range(16, 20)])
UPSERT = ["--record-key", "id", "--precombine-field", "ts", "--partition-field", "region", "--delete-field",
          "is_deleted", "--engine", "arrow"]


def upload(bucket: str, name: str, rows: list[dict[str, Any]]) -> str:
    """A batch as Parquet in the bucket: the source is on S3 too."""
    io, path = resolve(f"{bucket}/landing/{name}")
    pq.write_table(pa.Table.from_pylist(rows), path, filesystem=io.fs)
    return f"{bucket}/landing/{name}"


def snapshot(uri: str, as_of: str | None = None) -> dict:
    return rows_by_identity(read_arrow(uri, as_of).to_pylist())


def run(capsys, *argv: str) -> str:  # type: ignore[no-untyped-def]
    capsys.readouterr()
    status = cli(list(argv))
    out, err = capsys.readouterr()
    assert status == 0, (argv, err[-2000:])
    return out


def validated(capsys, uri: str) -> dict:  # type: ignore[no-untyped-def]
    report = json.loads(run(capsys, "validate", uri, "--engine", "arrow"))
    assert report["ok"], report
    return report


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_arrow_verbs_on_an_s3_table_with_an_s3_source(bucket, s3, tmp_path, capsys, table_type):
    uri = f"{bucket}/orders"
    one, two = reduce_batches([B1]), reduce_batches([B1, B2])
    assert any(two[k]["region"] != one[k]["region"] for k in one if k in two), "the batch moves partitions"

    # upsert twice from S3 sources
    # merge-on-read without automatic compaction: the logs stay for the compaction below
    auto = ["--auto-compact", "off"] if table_type == "merge_on_read" else []
    out = run(capsys, "upsert", uri, upload(bucket, "b1.parquet", B1), *UPSERT, "--table-type", table_type, *auto,
              "--num-buckets", "2", "--batch-id", "b1")
    assert json.loads(out.splitlines()[-1])["counts"]["inserted"] == 16
    first = Table.load(uri).timeline.completed(["commit"])[-1].timestamp
    assert snapshot(uri) == one
    validated(capsys, uri)
    out = run(capsys, "upsert", uri, upload(bucket, "b2 é+%.parquet", B2), *UPSERT, "--batch-id", "b2")
    counts = json.loads(out.splitlines()[-1])["counts"]
    assert counts["deleted"] == 3 and counts["moved"] >= 8 and counts["inserted"] == 4, counts
    assert snapshot(uri) == two
    assert validated(capsys, uri)["rows"] == len(two)
    t = Table.load(uri)
    if table_type == "merge_on_read":  # updates in place went to logs
        assert any(fs.logs for fs in t.view().file_groups.values())
    # a rerun of a committed batch is a no-op
    out = run(capsys, "upsert", uri, f"{bucket}/landing/b2 é+%.parquet", *UPSERT, "--batch-id", "b2")
    assert json.loads(out.splitlines()[-1])["noop"]
    if table_type == "copy_on_write":
        return  # the other verbs run once, on merge-on-read (logs to merge and to compact): the suite's time

    # read: printed, to a local file, to an S3 object, and as of the first commit
    printed = run(capsys, "read", uri, "--engine", "arrow", "--limit", "100")
    for key in two:
        assert key in printed
    assert KEY.format(11) not in printed  # deleted
    local = tmp_path / "snap shot.parquet"
    run(capsys, "read", uri, "--engine", "arrow", "--output", str(local))
    assert rows_by_identity(pq.read_table(local).to_pylist()) == two
    out_uri = f"{bucket}/exports/snap é.parquet"
    run(capsys, "read", uri, "--engine", "arrow", "--output", out_uri)
    io, path = resolve(out_uri)
    assert rows_by_identity(pq.read_table(path, filesystem=io.fs).to_pylist()) == two
    run(capsys, "read", uri, "--engine", "arrow", "--as-of", first, "--output", str(tmp_path / "first.parquet"))
    assert rows_by_identity(pq.read_table(tmp_path / "first.parquet").to_pylist()) == one
    assert snapshot(uri, first) == one

    # compact: schedule, cancel (rollback of the named plan), schedule again, execute
    what = ["--min-logs", "1", "--min-deltas", "1"]  # the data (logs) and the index (deltas), both due
    planned = run(capsys, "compact", uri, "--schedule-only", *what).splitlines()[-1]
    assert Table.load(uri).timeline.pending()[0].timestamp == planned
    assert run(capsys, "rollback", uri, planned).strip() == f"rolled back {planned}"
    assert Table.load(uri).timeline.pending() == []
    assert snapshot(uri) == two
    planned = run(capsys, "compact", uri, "--schedule-only", *what).splitlines()[-1]
    result = json.loads(run(capsys, "compact", uri, "--execute", planned, "--engine", "arrow").splitlines()[0])
    assert result["executed"] and result["instant"] == planned, result
    t = Table.load(uri)
    assert t.timeline.pending() == []
    assert not any(fs.logs for fs in t.view().file_groups.values()), "the data compaction folded every log"
    assert all(len(files) == 1 for files in t.view().index_files.values()), "one index file per bucket"
    assert snapshot(uri) == two
    validated(capsys, uri)

    # clean: only the latest snapshot retained; its files stay, older versions go
    result = json.loads(run(capsys, "clean", uri, "--retain-commits", "1").splitlines()[0])
    assert result["files"] > 0, result
    assert snapshot(uri) == two
    assert Table.load(uri).missing_files(Table.load(uri).view()) == []
    validated(capsys, uri)

    # shadow-compare: the index agrees with a scan of the data
    report = json.loads(run(capsys, "shadow-compare", uri, "--engine", "arrow"))
    assert report["ok"] and report["mismatches"] == 0 and report["keys_checked"] == len(two), report

    # show: the table as a user sees it
    shown = run(capsys, "show", uri)
    assert uri in shown and f"{len(two)} rows" in shown and table_type in shown
    described = json.loads(run(capsys, "show", uri, "--json"))
    assert described["uri"] == uri and described["config"]["table_type"] == table_type
