"""The Delta Lake projection (issue 26, Deliver 1-3): ``_delta_log/<seq>.json`` written after
each commit point, read back by ``deltalake`` (delta-rs), the reader other engines use.

For every version ``v`` of the log, ``DeltaTable(uri, version=v).to_pyarrow_table()`` must equal
the snapshot right after sequence entry ``v``: ``read_arrow(uri, as_of=<instant of entry v>)`` for
copy-on-write, and for merge-on-read the read-optimized view (bases only), computed here
independently from the view's base files with plain pyarrow. Versions older than clean's
retained window are refused by our reader and listed files clean deleted, so both must fail.

Arrow engine only, in process (``spark_jobs.cli.main``) except where a process must die or
race: the SIGKILL between the commit point and the log write, and concurrent writers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.cli import main
from spark_jobs.exceptions import BadInputError
from spark_jobs.table import Table, delta
from spark_jobs.table.reader import read_arrow
from tests.harness.delta_reads import read_delta, read_optimized, read_view
from tests.harness.delta_reads import sorted_rows as _rows
from spark_jobs.table.view import FileSystemView
from tests.oracle import reduce_batches, rows_by_identity

deltalake = pytest.importorskip("deltalake")

pytestmark = pytest.mark.unit

#: partition values as users have them: spaces, '/', '%', '+', non-ASCII, null
REGIONS = ["eu west", "a/b", "100%", "x+y", "são paulo", None]
KEY_ARGS = ["--record-key", "id", "--precombine-field", "ts", "--partition-field", "region",
            "--delete-field", "is_deleted", "--engine", "arrow"]


def _row(i: int, region: str | None, ts: int, *, deleted: bool = False, **more: object) -> dict:
    return {"id": f"k {i:03d}/é+%", "region": region, "ts": ts, "amount": float(i) + ts / 10,
            "is_deleted": deleted, **more}


def _write(tmp: Path, name: str, rows: list[dict]) -> str:
    path = tmp / "src" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _cli(*argv: str) -> None:
    assert main(list(argv)) == 0, argv


def _upsert(uri: str, tmp: Path, batch: str, rows: list[dict], *extra: str) -> None:
    _cli("upsert", uri, _write(tmp, batch, rows), *KEY_ARGS, "--batch-id", batch, *extra)


def check_every_version(uri: str, *, storage_options: dict | None = None, read=read_delta) -> int:
    """Every version of the log equals the snapshot of its sequence entry, read by ``read``;
    returns how many versions were compared (retained ones)."""
    table = Table.load(uri)
    tl = table.timeline.reload()
    assert delta.versions_present(table) == list(range(tl.last_seq + 1)), "no gap, version == sequence"
    kept = table.retained_from()
    compared = 0
    for v in range(tl.last_seq + 1):
        log_lines = [json.loads(x) for x in table.io.read_bytes(delta.version_file(table, v)).decode().splitlines()]
        info = next(a["commitInfo"] for a in log_lines if "commitInfo" in a)
        assert info["bucketindex"]["seq"] == v
        if v == 0:
            got = read(uri, 0, storage_options)
            assert got.num_rows == 0
            continue
        entry = tl.entry(v)
        assert info["bucketindex"]["instant"] == entry["instant"]
        if kept is not None and v < kept["earliest_retained_seq"]:
            with pytest.raises(BadInputError, match="older than the retained window"):
                read_arrow(uri, as_of=entry["instant"])
            continue
        view = FileSystemView.at_seq(tl, v)
        names = [f.name for f in view.schema if not f.name.startswith("_bi_")]
        got = read(uri, v, storage_options)
        assert got.column_names == names, v  # the published schema: no _bi_* column, in order
        if table.config.merge_on_read:
            want = read_optimized(table, view)
        else:  # the snapshot right after entry v: with racing writers, instants are not in commit
            # order, so `as_of=<instant>` may name a later entry's snapshot (format.md §4.1)
            want = read_view(table, view)
        assert _rows(got, names) == _rows(want, names), f"version {v} ({entry['action']})"
        compared += 1
    return compared


def _history(uri: str, tmp: Path, index: str, table_type: str) -> list[list[dict]]:
    """Upserts with updates, deletes, partition moves and odd partition values, an alter, a
    compaction (data on merge-on-read, index on a record-index table), every version checked,
    a clean that deletes files old versions list, and an upsert after it. Returns the batches
    (for the oracle)."""
    b1 = [_row(i, REGIONS[i % len(REGIONS)], 1) for i in range(12)]
    b2 = ([_row(i, REGIONS[i % len(REGIONS)], 2) for i in range(0, 12, 3)]  # updates
          + [_row(1, REGIONS[1], 2, deleted=True), _row(13, None, 2)]  # a delete, an insert into null
          + [_row(2, "x+y" if REGIONS[2] != "x+y" else "a/b", 3)])  # a partition move (bucket: a new identity)
    batches = [b1, b2]
    _upsert(uri, tmp, "b1", b1)
    _upsert(uri, tmp, "b2", b2)
    _cli("alter", uri, "--add-column", "note:string")
    b3 = [_row(i, REGIONS[i % len(REGIONS)], 4, note=f"n{i}") for i in (0, 4, 20)]
    _upsert(uri, tmp, "b3", b3)
    batches.append(b3)
    b4 = [_row(i, REGIONS[i % len(REGIONS)], 5, note="again") for i in (3, 5, 21)] + [_row(6, REGIONS[0], 5, deleted=True,
                                                                                             note=None)]
    _upsert(uri, tmp, "b4", b4)
    batches.append(b4)
    if table_type == "merge_on_read":
        _cli("compact", uri, "--min-logs", "1", "--only", "data")
    elif index == "record":
        _cli("compact", uri, "--min-deltas", "1")
    assert check_every_version(uri) == Table.load(uri).timeline.last_seq  # before the clean: all of them
    _cli("clean", uri, "--retain-commits", "1")
    assert Table.load(uri).retained_from() is not None, "the clean deleted files"
    b5 = [_row(i, REGIONS[(i + 1) % len(REGIONS)], 6, note="late") for i in (7, 8, 30)]
    _upsert(uri, tmp, "b5", b5)
    batches.append(b5)
    return batches


@pytest.mark.parametrize("index,table_type", [("record", "copy_on_write"), ("bucket", "copy_on_write"),
                                              ("record", "merge_on_read"), ("bucket", "merge_on_read")])
def test_every_version_equals_the_snapshot(tmp_path, index, table_type):
    uri = str(tmp_path / "t")
    first = [_row(i, REGIONS[i % len(REGIONS)], 0) for i in range(3)]
    _upsert(uri, tmp_path, "b0", first, "--index", index, "--num-buckets", "2", "--table-type", table_type,
            "--mirror", "delta")
    batches = [first, *_history(uri, tmp_path, index, table_type)]
    partition = "region" if index == "bucket" else None
    expected = reduce_batches(batches, partition=partition)
    latest = read_arrow(uri)
    assert {k: {c: r[c] for c in ("id", "region", "ts", "amount")} for k, r in
            rows_by_identity(latest.to_pylist(), partition=partition).items()} == \
        {k: {c: r[c] for c in ("id", "region", "ts", "amount")} for k, r in expected.items()}
    compared = check_every_version(uri)
    assert compared >= 3
    table = Table.load(uri)
    # real partition values (not directory names), null as null; a new metaData at the alter
    actions = [json.loads(x) for v in delta.versions_present(table)
               for x in table.io.read_bytes(delta.version_file(table, v)).decode().splitlines()]
    # the string partition field is a data column (Delta readers read "" in partitionValues as
    # null, issue 36): each file's one value is in its statistics (none at all: a float column)
    adds = [a["add"] for a in actions if "add" in a]
    assert all(a["partitionValues"] == {} for a in adds)
    nulls = [json.loads(a["stats"])["nullCount"]["region"] for a in adds]
    assert 0 in nulls and any(nulls), "files of null and of non-null regions"
    metas = [a["metaData"] for a in actions if "metaData" in a]
    assert [json.loads(m["schemaString"])["fields"][-1]["name"] for m in metas] == ["amount", "note"]
    assert all(m["partitionColumns"] == [] for m in metas)
    adds = [a["add"] for a in actions if "add" in a]
    assert all(json.loads(a["stats"])["numRecords"] >= 0 for a in adds if "stats" in a)
    if table_type == "merge_on_read":  # the compaction brought the logs' rows in: Delta sees the merged table
        # the explicit compaction before the clean (the window keeps it; the upserts' automatic
        # ones before it are outside the window)
        kept = table.retained_from()
        seq = max(n for n in range(kept["earliest_retained_seq"], table.timeline.last_seq + 1)
                  if table.timeline.entry(n)["action"] == "compaction")
        got = deltalake.DeltaTable(uri, version=seq).to_pyarrow_table()
        assert got.num_rows == FileSystemView.at_seq(table.timeline, seq).num_rows > 0


def _cli_proc(uri: str, src: str, batch: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "spark_jobs.cli", "upsert", uri, src, *KEY_ARGS,
                             "--batch-id", batch], env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_a_kill_between_commit_and_log_is_repaired(tmp_path):
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "b0", [_row(i, REGIONS[i % 6], 0) for i in range(6)], "--mirror", "delta")
    for n, repair_by in ((1, "next write"), (2, "mirror --repair")):
        src = _write(tmp_path, f"k{n}", [_row(i, REGIONS[(i + n) % 6], n) for i in range(4)])
        p = _cli_proc(uri, src, f"k{n}", {"BUCKETINDEX_FAULT": "after_commit_before_mirror"})
        p.communicate(timeout=120)
        assert p.returncode == -9
        table = Table.load(uri)
        seq = table.timeline.last_seq
        assert table.timeline.entry(seq)["metadata"]["batch_id"] == f"k{n}", "the commit point was passed"
        assert delta.versions_present(table)[-1] == seq - 1, "Delta readers stay at the previous version"
        stale = deltalake.DeltaTable(uri)
        assert stale.version() == seq - 1
        names = ["id", "region", "ts", "amount"]
        prev = read_arrow(uri, as_of=table.timeline.entry(seq - 1)["instant"])
        assert _rows(stale.to_pyarrow_table(), names) == _rows(prev, names)
        if repair_by == "next write":
            _upsert(uri, tmp_path, f"after{n}", [_row(50 + n, "eu west", 9)])
        else:
            _cli("mirror", uri, "--repair")
            _cli("mirror", uri, "--repair")  # idempotent
    check_every_version(uri)


def test_a_rollback_gets_its_delta_version_at_once(tmp_path):
    """A rollback's decision is a sequence entry: its Delta version (commitInfo only) is written
    by the rollback, not left for the next commit (found by the torture test, seed 16 with the
    mirror: a forced rollback left the log one version behind with no process killed)."""
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "b0", [_row(i, REGIONS[i % 6], 0) for i in range(6)], "--mirror", "delta")
    src = _write(tmp_path, "k1", [_row(i, REGIONS[(i + 1) % 6], 1) for i in range(4)])
    p = _cli_proc(uri, src, "k1", {"BUCKETINDEX_FAULT": "before_complete"})
    p.communicate(timeout=120)
    assert p.returncode == -9
    pending = Table.load(uri).pending_for_batch("k1")
    assert pending is not None
    _cli("rollback", uri, pending.timestamp, "--force")
    table = Table.load(uri)
    seq = table.timeline.last_seq
    assert table.timeline.entry(seq)["action"] == "rollback"
    assert delta.versions_present(table) == list(range(seq + 1)), "no gap after the rollback"
    lines = [json.loads(x) for x in table.io.read_bytes(delta.version_file(table, seq)).decode().splitlines()]
    assert [next(iter(a)) for a in lines] == ["commitInfo"]
    assert deltalake.DeltaTable(uri).version() == seq
    check_every_version(uri)


def test_concurrent_writers_leave_no_gap_and_no_duplicate(tmp_path):
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "base", [_row(i, REGIONS[i % 6], 0) for i in range(12)], "--mirror", "delta")
    procs = []
    for w in range(3):  # disjoint keys, overlapping windows: they all commit, in some order
        src = _write(tmp_path, f"w{w}", [_row(100 * (w + 1) + i, REGIONS[w], 1) for i in range(3)])
        procs.append(_cli_proc(uri, src, f"w{w}", {"BUCKETINDEX_PAUSE": "after_conflict_check=1"}))
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
    table = Table.load(uri)
    assert table.timeline.last_seq == 4
    check_every_version(uri)
    latest = deltalake.DeltaTable(uri)
    assert latest.version() == 4 and latest.to_pyarrow_table().num_rows == 21


def test_enable_on_an_existing_table_and_bad_input(tmp_path, capsys):
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "b0", [_row(i, REGIONS[i % 6], 0) for i in range(4)])
    _upsert(uri, tmp_path, "b1", [_row(i, REGIONS[i % 6], 1) for i in range(2, 6)])
    assert not os.path.exists(os.path.join(uri, "_delta_log"))
    n = Table.load(uri).timeline.last_seq  # a default (merge-on-read) table: its upserts may have compacted too
    assert main(["mirror", uri, "--repair"]) == 2  # not enabled: one line, exit 2, nothing written
    assert main(["upsert", uri, _write(tmp_path, "x", [_row(9, "eu west", 3)]), *KEY_ARGS, "--mirror", "delta"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("bucketindex: error:") for line in err)
    assert not os.path.exists(os.path.join(uri, "_delta_log"))
    assert Table.load(uri).timeline.last_seq == n
    config_before = Path(uri, ".bucketindex", "table.json").read_bytes()
    _cli("mirror", uri, "--enable", "delta")
    # a table-properties commit on the timeline; table.json (fixed at creation) is not rewritten
    assert Path(uri, ".bucketindex", "table.json").read_bytes() == config_before
    table = Table.load(uri)
    assert table.timeline.last_seq == n + 1
    entry = table.timeline.entry(n + 1)
    assert entry["metadata"]["operation"] == "set_properties"
    assert entry["metadata"]["properties"] == {"mirrors": ["delta"]}
    assert table.view().properties == {"mirrors": ["delta"]}
    assert delta.versions_present(table) == list(range(n + 2))  # the history, written by the commit's hook
    capsys.readouterr()
    _cli("show", uri)
    assert "properties mirrors = delta" in capsys.readouterr().out
    _cli("mirror", uri, "--enable", "delta")  # again: nothing committed
    assert Table.load(uri).timeline.last_seq == n + 1
    _upsert(uri, tmp_path, "b2", [_row(7, "a/b", 2)], "--mirror", "delta")  # now on: accepted
    check_every_version(uri)
    assert delta.versions_present(Table.load(uri)) == list(range(Table.load(uri).timeline.last_seq + 1))
    assert Table.load(uri).timeline.last_seq > n + 1


def test_an_enabled_mirror_survives_archival_and_reaches_writers_opened_before(tmp_path):
    """The property lives on the timeline: a checkpoint carries it after the entry that set it
    is archived, and a writer holding a snapshot from before the enable mirrors its commit
    (its hook reads the properties of the entries committed since its snapshot)."""
    from spark_jobs.arrow_engine.upsert import run_upsert
    from spark_jobs.table.action.mirror import enable_mirror
    from spark_jobs.table.action.upsert import UpsertOptions

    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "b0", [_row(i, REGIONS[i % 6], 0) for i in range(6)])
    stale = Table.load(uri)
    stale_view = stale.view()
    enable_mirror(uri, "delta")
    from spark_jobs.table.action.transaction import Transaction
    from spark_jobs.table.timeline import Action

    # a commit planned on the snapshot from before the enable: its hook still mirrors it
    txn = Transaction(stale, Action.COMMIT, {"operation": "set_properties"}, view=stale_view)
    txn.run(lambda view, retries: {"action": Action.COMMIT, "instant": txn.ts, "operation": "set_properties",
                                   "snapshot_seq": view.seq, "file_groups": [], "properties": {"note": "x"}},
            max_retries=1)
    assert delta.versions_present(Table.load(uri)) == [0, 1, 2, 3]
    src = _write(tmp_path, "late", [_row(1, "a/b", 5)])
    run_upsert(UpsertOptions(table=uri, source=src, batch_id="late", record_key=["id"], precombine_field="ts",
                             partition_field="region", delete_field="is_deleted"))
    for n in range(8):
        _upsert(uri, tmp_path, f"c{n}", [_row(n, REGIONS[n % 6], 10 + n)])
    table = Table.load(uri)
    assert table.timeline.checkpoint is not None and table.timeline.base_seq > 2  # the enable is behind it
    assert table.view().properties == {"mirrors": ["delta"], "note": "x"}
    assert delta.versions_present(table) == list(range(table.timeline.last_seq + 1))
    check_every_version(uri)


def test_checkpoint_every_ten_versions(tmp_path):
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "b0", [_row(0, "eu west", 0)], "--mirror", "delta")
    for n in range(1, 11):
        _upsert(uri, tmp_path, f"b{n}", [_row(n, REGIONS[n % 6], n)])
    log_dir = Path(uri, "_delta_log")
    assert (log_dir / f"{10:020d}.checkpoint.parquet").exists()
    assert json.loads((log_dir / "_last_checkpoint").read_text())["version"] == 10
    assert deltalake.DeltaTable(uri).to_pyarrow_table().num_rows == 11


def test_on_object_storage(bucket, s3):
    uri = f"{bucket}/lake/t"
    src = f"{bucket}/src/b0.parquet"
    import pyarrow.fs as pafs

    from spark_jobs.io.filesystem import resolve

    io, path = resolve(src)
    with io.fs.open_output_stream(path) as f:
        pq.write_table(pa.Table.from_pylist([_row(i, REGIONS[i % 6], 0) for i in range(6)]), f)
    _cli("upsert", uri, src, *KEY_ARGS, "--batch-id", "b0", "--mirror", "delta")
    io2, src2 = resolve(f"{bucket}/src/b1.parquet")
    with io2.fs.open_output_stream(src2) as f:
        pq.write_table(pa.Table.from_pylist([_row(i, REGIONS[(i + 1) % 6], 1) for i in range(3)]), f)
    _cli("upsert", uri, f"{bucket}/src/b1.parquet", *KEY_ARGS, "--batch-id", "b1")
    assert isinstance(io.fs, pafs.S3FileSystem)
    opts = {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": s3.access_key_id,
            "AWS_SECRET_ACCESS_KEY": s3.env()["AWS_SECRET_ACCESS_KEY"], "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true"}
    assert check_every_version(uri, storage_options=opts) == 2
