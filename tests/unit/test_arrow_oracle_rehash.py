"""Rehash's bad counts, with tables the in-process Arrow engine wrote: exit 2 with one line and
nothing written, before a Spark session starts; a count equal to the table's is exit 0, nothing
written. The rehashes themselves (on Spark) against the oracle: tests/spark/test_rehash.py, which
imports this module's batches and upsert."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.cli import main
from spark_jobs.index.hashing import buckets_of, fingerprints
from spark_jobs.index.record_index import merge_entries
from spark_jobs.table.reader import read_arrow, read_slice
from spark_jobs.table.action import Transaction
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action
from tests.unit.test_arrow_oracle_upsert import (
    _dedupe_ties,
    make_batches,
    tree_digest,
    write_batch,
)

pytestmark = pytest.mark.unit

#: partition values as users have them: spaces, '/', '%', '+', non-ASCII
ODD_REGIONS = {"eu": "eu west/1", "us": "us %2F+east", "ap": "亚太 ap"}


def _batches(seed: int, per_partition: bool) -> list[list[dict]]:
    batches = make_batches(seed=seed, n_batches=5, pool=160, size=90)
    for rows in batches:
        for r in rows:
            r["region"] = ODD_REGIONS[r["region"]]
            r["id"] = r["id"] + (" /%+ключ" if int(r["id"][-2:]) % 5 == 0 else "")  # odd keys too
    _dedupe_ties(batches, per_partition)
    return batches


def _upsert(uri: str, tmp_path: Path, batches: list, i: int, **kw):  # type: ignore[no-untyped-def]
    """Upsert ``batches[i]`` on the Arrow engine, in this process."""
    return run_upsert(UpsertOptions(
        table=uri, source=write_batch(tmp_path / f"b{i}.parquet", batches[i]), record_key=["id"],
        precombine_field="ts", partition_field="region", delete_field="is_deleted", batch_id=f"b{i}", **kw))


def assert_layout(uri: str, num_buckets: int) -> None:
    """Every row (bucket index) or index entry (record index) is in bucket hash(key) mod M."""
    table = Table.load(uri)
    view = table.view()
    assert table.num_buckets(view) == num_buckets
    assert table.config is not None
    if table.config.index_type == "bucket":
        for s in view.slices():
            keys = read_slice(table, s.path, [lf.path for lf in s.logs], columns=["_bi_key"]).column(0).to_pylist()
            assert keys, f"empty file group {s.partition}/{s.file_id}"
            assert set(buckets_of(keys, num_buckets).tolist()) == {int(s.file_id)}, (s.partition, s.file_id)
        return
    keys = read_arrow(uri, with_meta=True).column("_bi_key").to_pylist()
    expected: dict[int, set] = {}
    for k, b in zip(keys, buckets_of(keys, num_buckets).tolist()):
        expected.setdefault(b, set()).add(fingerprints([k])[0][0].item())
    # no bucket of the old layout lingers in the snapshot (show and the skew report count them)
    assert all(b < num_buckets and files for b, files in view.index_files.items()), sorted(view.index_files)
    got = {}
    for b, files in view.index_files.items():
        e = merge_entries(table.io, [table.abs(f) for f in files])
        if len(e):
            assert b < num_buckets, f"index entries in bucket {b} of {num_buckets}"
            got[b] = set(e.fp_hi.tolist())
    assert got == expected


def test_bad_counts_exit_2_and_leave_the_table_untouched(tmp_path, capsys, monkeypatch):
    # none of these needs Spark: a session started here would fail the test
    monkeypatch.setattr("spark_jobs.cli._spark", lambda *a: pytest.fail("rehash started a Spark session"))
    uri = str(tmp_path / "t")
    batches = _batches(seed=3, per_partition=False)
    _upsert(uri, tmp_path, batches, 0, index="record", num_buckets=8)
    gs = str(tmp_path / "gs")
    _upsert(gs, tmp_path, batches, 0, index="global_simple")
    before = tree_digest(tmp_path)
    cases = {
        "12": "neither a multiple nor a divisor of the table's 8 buckets",
        "0": "at least 1",
        "131072": "above the maximum of 65536",
    }
    for count, message in cases.items():
        assert main(["rehash", uri, "--num-buckets", count]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    assert main(["rehash", gs, "--num-buckets", "32"]) == 2
    err = capsys.readouterr().err.strip()
    assert "global_simple index, which has no buckets" in err and len(err.splitlines()) == 1
    assert main(["rehash", str(tmp_path / "nothing"), "--num-buckets", "16"]) == 2
    capsys.readouterr()
    # a rehash already running (a live writer) refuses a second one
    table = Table.load(uri)
    running = Transaction(table, Action.REHASH, {"num_buckets": 16}).begin()
    try:
        mid = tree_digest(tmp_path)
        assert main(["rehash", uri, "--num-buckets", "16"]) == 2
        err = capsys.readouterr().err
        assert "a rehash is already running" in err and running.ts in err
        assert tree_digest(tmp_path) == mid
    finally:
        running.abort()
    assert tree_digest(tmp_path) == before
    # the same count: nothing to do, exit 0, nothing written
    assert main(["rehash", uri, "--num-buckets", "8"]) == 0
    assert "already has 8 buckets" in capsys.readouterr().out
    assert tree_digest(tmp_path) == before
