"""The Delta projection (issue 26) across the Spark-only actions: a rehash of a bucket-index
table rewrites every file group (its version removes the old bases and adds the new ones with
``dataChange: false``), up and then down, with upserts (Arrow engine: the hook is the
engine-neutral ``Transaction``'s) and a merge-on-read compaction between. Every retained Delta version must equal the snapshot of its sequence entry
(tests/unit/test_delta_mirror.py's check), and the latest must equal the oracle.

The reference-bootstrapped case (absolute ``add.path``s, read through delta-rs's SQL engine)
is tests/spark/test_bootstrap.py's merge-on-read reference test.
"""

from __future__ import annotations

import pytest

from spark_jobs.cli import main
from spark_jobs.table import Table, delta
from tests.harness.delta_reads import read_delta
from tests.oracle import reduce_batches, rows_by_identity
from tests.unit.test_delta_mirror import KEY_ARGS, REGIONS, _row, _write, check_every_version

pytestmark = pytest.mark.spark


def _cli(*argv: str) -> None:
    assert main(list(argv)) == 0, argv


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_every_version_through_a_rehash_up_and_down(spark, tmp_path, table_type):
    uri = str(tmp_path / "t")
    batches = [[_row(i, REGIONS[i % len(REGIONS)], 1) for i in range(30)]]
    _cli("upsert", uri, _write(tmp_path, "b0", batches[0]), *KEY_ARGS, "--index", "bucket", "--num-buckets", "2",
         "--table-type", table_type, "--mirror", "delta", "--batch-id", "b0")
    batches.append([_row(i, REGIONS[(i + 1) % len(REGIONS)], 2) for i in range(0, 30, 4)]  # moves (new identities)
                   + [_row(i, REGIONS[i % len(REGIONS)], 2, deleted=True) for i in (1, 5)])
    _cli("upsert", uri, _write(tmp_path, "b1", batches[1]), *KEY_ARGS, "--batch-id", "b1")
    _cli("rehash", uri, "--num-buckets", "6", "--master", "local[2]")
    batches.append([_row(i, REGIONS[i % len(REGIONS)], 3) for i in range(25, 40)])
    _cli("upsert", uri, _write(tmp_path, "b2", batches[2]), *KEY_ARGS, "--batch-id", "b2")
    if table_type == "merge_on_read":  # a log's rows reach Delta readers with the compaction
        _cli("compact", uri, "--min-logs", "1", "--only", "data", "--master", "local[2]")
    _cli("rehash", uri, "--num-buckets", "3", "--master", "local[2]")
    table = Table.load(uri)
    rehashes = [n for n in range(1, table.timeline.last_seq + 1) if table.timeline.entry(n)["action"] == "rehash"]
    assert len(rehashes) == 2
    for n in rehashes:  # a rehash moves rows between files: Delta readers see no data change
        adds = [a["add"] for a in delta.version_actions(table, n, *_views(table, n), first_schema=table.view().schema)
                if "add" in a]
        assert adds and not any(a["dataChange"] for a in adds)
    assert check_every_version(uri, read=read_delta) == table.timeline.last_seq
    # the latest version is the oracle (bucket index: a key's identity is key + partition)
    cols = ("id", "region", "ts", "amount")
    want = {k: {c: r[c] for c in cols} for k, r in reduce_batches(batches, partition="region").items()}
    got = rows_by_identity(read_delta(uri, table.timeline.last_seq).to_pylist(), partition="region")
    assert {k: {c: r[c] for c in cols} for k, r in got.items()} == want


def _views(table, n):  # type: ignore[no-untyped-def]
    from spark_jobs.table.view import FileSystemView

    return FileSystemView.at_seq(table.timeline, n - 1), FileSystemView.at_seq(table.timeline, n)
