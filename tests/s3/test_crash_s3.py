"""A writer SIGKILLed in the middle of an upsert on S3 (the Arrow engine, a CLI subprocess in a
session of its own, killed at ``before_complete``: every data file, log and index delta written,
the commit point not claimed). Readers keep the old snapshot; the same command run again rolls
the abandoned instant back and commits; ``validate`` passes; and every object left in the bucket
is explained by a retained snapshot, the timeline or the table's metadata: no orphaned data file,
index delta, marker, heartbeat or temp object of the dead writer.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from spark_jobs.cli import main as cli
from spark_jobs.io.filesystem import resolve
from spark_jobs.table.commit import parse as parse_commit
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity

ROOT = Path(__file__).resolve().parents[2]
KEY = "k{:02d} /%+é"
REGIONS = ["eu west/1", None, "sã%o+paulo"]
B1 = [{"id": KEY.format(i), "region": REGIONS[i % 3], "ts": i, "amount": float(i), "is_deleted": False}
      for i in range(12)]
#: updates (some moving partition), deletes and inserts: every kind of file the writer leaves
B2 = [{"id": KEY.format(i), "region": REGIONS[(i + 1) % 3], "ts": 100 + i, "amount": -1.0, "is_deleted": i % 5 == 0}
      for i in range(6, 18)]
HEARTBEAT_TIMEOUT = 2.0  # seconds without a heartbeat before the dead writer's instant counts as abandoned
#: what the table's metadata directory may hold once nothing is pending: its config, the commit
#: sequence, the timeline's instant files and what checkpoints and archival retain
METADATA = re.compile(r"^\.bucketindex/(table\.json|sequence/\d+\.json|timeline/(\d{17})\.[a-z_]+\.[a-z]+"
                      r"|checkpoints?/.+|archive/.+)$")


def upsert_args(uri: str, src: str) -> list[str]:
    return ["upsert", uri, src, "--record-key", "id", "--precombine-field", "ts", "--partition-field", "region",
            "--delete-field", "is_deleted", "--batch-id", "batch-2", "--engine", "arrow",
            "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT)]


def upload(bucket: str, name: str, rows: list[dict[str, Any]]) -> str:
    io, path = resolve(f"{bucket}/landing/{name}")
    pq.write_table(pa.Table.from_pylist(rows), path, filesystem=io.fs)
    return f"{bucket}/landing/{name}"


def keys_under(s3, bucket: str, prefix: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Every object under ``prefix``, by its key relative to it (all pages)."""
    name = bucket.removeprefix("s3://")
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=name, Prefix=prefix)
    return sorted(o["Key"][len(prefix):] for page in pages for o in page.get("Contents", []))


def test_killed_upsert_on_s3_leaves_the_old_snapshot_and_the_rerun_repairs_leaving_no_stray_object(bucket, s3, capsys):
    """Merge-on-read: the dead writer leaves logs and new base files (a partition move), index
    deltas, markers and its heartbeat."""
    table_type = "merge_on_read"
    uri = f"{bucket}/orders"
    assert cli(["upsert", uri, upload(bucket, "b1.parquet", B1), "--record-key", "id", "--precombine-field", "ts",
                "--partition-field", "region", "--delete-field", "is_deleted", "--batch-id", "batch-1",
                "--engine", "arrow", "--table-type", table_type, "--num-buckets", "4"]) == 0
    before = rows_by_identity(read_arrow(uri).to_pylist())
    assert before == reduce_batches([B1])
    src2 = upload(bucket, "b2 ü+%.parquet", B2)

    # the writer dies with everything written but its commit point: a node gone, no cleanup
    p = subprocess.run([sys.executable, "-m", "spark_jobs.cli", *upsert_args(uri, src2)],
                       env={**os.environ, "BUCKETINDEX_FAULT": "before_complete"}, capture_output=True, text=True,
                       timeout=300, start_new_session=True, cwd=ROOT)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-2000:])
    t = Table.load(uri)
    (dead,) = t.timeline.pending()
    assert dead.action == "commit"
    left = keys_under(s3, bucket, "orders/")
    assert any(dead.timestamp in k and not k.startswith(".bucketindex") for k in left), "data files were written"
    assert any(k.startswith(".bucketindex/markers/") for k in left)
    # readers see the previous snapshot, whatever the dead writer left
    assert rows_by_identity(read_arrow(uri).to_pylist()) == before
    capsys.readouterr()
    assert cli(["validate", uri, "--engine", "arrow"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]

    # the same command again, once the dead writer's heartbeat is stale: repair, then commit
    time.sleep(HEARTBEAT_TIMEOUT + 0.5)
    assert cli(upsert_args(uri, src2)) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert not result["noop"] and result["instant"] != dead.timestamp
    t = Table.load(uri)
    assert t.timeline.pending() == [] and t.timeline.aborted_leftovers() == []
    assert t.timeline.state_of(dead.timestamp) == "aborted"
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches([B1, B2])
    assert cli(["validate", uri, "--engine", "arrow"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]
    assert cli(upsert_args(uri, src2)) == 0  # and a retry of the batch applies nothing twice
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["noop"]

    # no stray objects: every key is a file of a retained snapshot or the table's metadata
    t = Table.load(uri)
    completed = t.timeline.completed()
    # (the snapshots of the upserts and of their automatic compactions: a merge-on-read table's default)
    retained = set().union(*(t.view(i.timestamp).all_files() for i in completed
                             if i.action in ("commit", "compaction")))
    on_timeline = {i.timestamp for i in completed}
    # a commit's read files (what it decided without writing, format.md §4.5) stay with it
    retained |= {f.path for i in completed if i.action == "commit"
                 for f in parse_commit(t.timeline.read_metadata(i)).read_set.index}
    stray = []
    for key in keys_under(s3, bucket, "orders/"):
        m = METADATA.match(key)
        if key in retained or (m and (m.group(2) is None or m.group(2) in on_timeline)):
            continue
        stray.append(key)
    assert stray == [], f"objects no snapshot, timeline entry or metadata explains: {stray}"
    assert not [k for k in keys_under(s3, bucket, "orders/") if dead.timestamp in k]
    assert not [k for k in keys_under(s3, bucket, "") if k.endswith(".tmp")]
