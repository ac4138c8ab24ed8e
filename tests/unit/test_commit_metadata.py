"""Typed commit metadata (spark_jobs.table.commit): one JSON round trip that gives back exactly
what the product wrote -- for every completed entry of real tables (upsert on both table types
and all three index types, a rewrite bootstrap, compaction, rollback, clean) -- and the unit
shapes of format.md §3.3-3.4 and §5.2-5.3 (log entries, removed groups, compaction and
reference entries, unknown keys kept)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.compact import run_compact
from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.table.action import Transaction
from spark_jobs.table.action.clean import run_clean
from spark_jobs.table.action.compact import CompactionPolicy
from spark_jobs.table.action.conflict import WriteSet
from spark_jobs.table.action.rollback import referenced_files, rollback
from spark_jobs.table.action.upsert import UpsertOptions, file_group_entry
from spark_jobs.table.commit import (
    CommitMetadata,
    EngineInfo,
    FileGroupChange,
    IndexFileChange,
    LogChange,
    parse,
)
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.describe import describe
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action

SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.int64()), ("is_deleted", pa.bool_())])


def _rows(b: int) -> list[dict]:
    """Inserts, updates, a partition move and deletes (batch ``b``)."""
    rows = [{"id": f"k{k} /%+é", "region": ["eu", "us", None][(k + b) % 3], "ts": b * 100 + k,
             "is_deleted": b > 0 and k % 7 == 0} for k in range(b * 10, b * 10 + 40)]
    return rows


def _upsert(tmp_path: Path, uri: str, index: str, table_type: str, b: int, **kw) -> dict:
    src = tmp_path / f"b{b}.parquet"
    pq.write_table(pa.Table.from_pylist(_rows(b), schema=SCHEMA), src)
    return run_upsert(UpsertOptions(table=uri, source=str(src), record_key=["id"], precombine_field="ts",
                                    partition_field="region", index=index, num_buckets=4, delete_field="is_deleted",
                                    batch_id=f"b{b}", target_file_rows=15, table_type=table_type, **kw))


def _entries(uri: str) -> list[tuple[str, dict]]:
    t = Table.load(uri)
    return [(inst.action, t.timeline.read_metadata(inst)) for inst in t.timeline.completed()]


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
@pytest.mark.parametrize("index", ["record", "bucket", "global_simple"])
def test_every_metadata_the_product_writes_round_trips(tmp_path, index, table_type):
    uri = str(tmp_path / "t")
    # the first batch as a rewrite bootstrap (what `bootstrap --mode rewrite` records)
    _upsert(tmp_path, uri, index, table_type, 0, action=Action.BOOTSTRAP, operation="bootstrap",
            extra_metadata={"bootstrap": {"source": "/warehouse/x", "mode": "rewrite", "counts": {"rows": 40}}})
    for b in (1, 2, 3):
        _upsert(tmp_path, uri, index, table_type, b)
    if table_type == "merge_on_read" or index == "record":  # anything else has nothing to compact
        out = run_compact(uri, policy=CompactionPolicy(min_logs=1, min_deltas=2))
        assert out["executed"], out
    # a pending commit, rolled back
    t = Table.load(uri)
    txn = Transaction(t, Action.COMMIT, {"batch_id": "abandoned"}).begin()
    txn._heartbeat.stop()  # type: ignore[union-attr]
    assert rollback(t, txn.ts, force=True) == [txn.ts]
    _upsert(tmp_path, uri, index, table_type, 4)
    assert not run_clean(uri, retain_commits=1)["noop"]

    entries = _entries(uri)
    actions = {a for a, _ in entries}
    assert {Action.BOOTSTRAP, Action.COMMIT, Action.ROLLBACK, Action.CLEAN} <= actions, actions
    if table_type == "merge_on_read" or index == "record":
        assert Action.COMPACTION in actions
    if table_type == "merge_on_read":
        assert any("log" in fg for _, m in entries for fg in m.get("file_groups", []))
    for action, meta in entries:
        frozen = copy.deepcopy(meta)
        commit = CommitMetadata.from_json(meta)
        assert commit.to_json() == meta, action
        assert json.dumps(commit.to_json(), sort_keys=True) == json.dumps(meta, sort_keys=True)
        assert meta == frozen, "parsing must not change the dict"
        # the typed readers agree with the dict they replace
        assert commit.referenced_files() == (
            {fg["path"] for fg in meta.get("file_groups", []) if fg.get("path")}
            | {fg["log"]["path"] for fg in meta.get("file_groups", []) if fg.get("log")}
            | {f["path"] for f in (meta.get("index") or {}).get("added", [])}
            | {f["path"] for f in (meta.get("reads") or {}).get("index", [])})
    # the view replayed through the type is the table's view
    t = Table.load(uri)
    assert t.view().num_rows == read_arrow(uri).num_rows
    shown = describe(t)["timeline"]  # `show` reads every entry through the type
    by_instant = {m.get("instant"): m for _, m in entries}
    for row in shown:
        meta = by_instant.get(row["instant"], {})
        assert row["batch_id"] == meta.get("batch_id") and row["engine"] == meta.get("engine")
        assert row["counts"] == meta.get("counts", {}) and row["rolled_back"] == meta.get("rolled_back")


def test_a_log_entry_keeps_exactly_its_keys():
    m = {"partition": "region=eu", "file_id": "f1", "row_delta": -3,
         "log": {"path": "region=eu/.f1_x.log.parquet", "num_rows": 5, "size": 900}}
    g = FileGroupChange.from_json(m)
    assert g.log == LogChange(path="region=eu/.f1_x.log.parquet", num_rows=5, size=900)
    assert g.path is None and g.removed is None and g.row_delta == -3
    assert g.to_json() == m and "path" not in g.to_json() and "removed" not in g.to_json()
    assert g.files() == {"region=eu/.f1_x.log.parquet"}
    # the upsert's writer builds it through the type
    assert file_group_entry({"part": "region=eu", "fid": "f1", "row_delta": -3, "log": True,
                             "path": "region=eu/.f1_x.log.parquet", "num_rows": 5, "size": 900}) == g
    assert g.to_json() == m


def test_a_removed_group_and_a_plain_base():
    removed = {"partition": "", "file_id": "0003", "path": None, "num_rows": 0, "size": 0, "removed": True}
    g = FileGroupChange.from_json(removed)
    assert g.removed and g.path is None and g.log is None and g.to_json() == removed
    assert g.files() == set()
    assert file_group_entry({"part": "", "fid": "0003", "path": None, "num_rows": 0, "size": 0, "log": False}) == g
    assert g.to_json() == removed
    plain = {"partition": "region=us", "file_id": "f2", "path": "region=us/f2_1_2.parquet", "num_rows": 7,
             "size": 10, "removed": False}
    assert FileGroupChange.from_json(plain).to_json() == plain
    rehash_removal = {"partition": "p", "file_id": "0001", "path": None, "removed": True}  # format.md §3.4
    assert FileGroupChange.from_json(rehash_removal).to_json() == rehash_removal


def test_compaction_and_reference_entries():
    compaction = {"partition": "p", "file_id": "f", "path": "p/f_a_3.parquet", "base_rows": 9, "size": 50,
                  "compacted_logs": ["p/.f_1.log", "p/.f_2.log"]}
    g = FileGroupChange.from_json(compaction)
    assert g.is_compaction and g.compacted_logs == ("p/.f_1.log", "p/.f_2.log") and g.to_json() == compaction
    reference = {"partition": "dt=1", "file_id": "f", "path": "../legacy/dt=1/part-0.parquet", "num_rows": 3,
                 "size": 99, "reference": True}
    assert FileGroupChange.from_json(reference).reference is True
    assert FileGroupChange.from_json(reference).to_json() == reference
    replaced = {"partition": "dt=1", "file_id": "g", "path": "dt=1/g_1.parquet", "num_rows": 2, "size": 9,
                "replaces": "../legacy/dt=1/part-1.parquet"}
    assert FileGroupChange.from_json(replaced).to_json() == replaced
    meta = {"action": "bootstrap", "instant": "1", "batch_id": "bootstrap-0123456789abcdef",
            "operation": "bootstrap", "index_type": "record", "num_buckets": 4, "snapshot_seq": 0, "schema": "AAAA",
            "file_groups": [reference, replaced],
            "index": {"added": [{"bucket": 0, "path": ".bucketindex/index/bucket=00000/delta_1.arrow",
                                 "entries": 5, "size": 100, "kind": "delta"}], "removed": []},
            "counts": {"inserted": 5, "updated": 0, "deleted": 0, "moved": 0, "rows_in_batch": 6},
            "bootstrap": {"source": "/legacy", "mode": "reference", "counts": {"rows": 5}}, "conflicts": [],
            "timings_ms": {"total_ms": 3}}
    c = CommitMetadata.from_json(meta)
    assert c.to_json() == meta
    assert c.get("bootstrap")["mode"] == "reference" and c.index_deltas() == {
        0: ".bucketindex/index/bucket=00000/delta_1.arrow"}
    assert referenced_files(meta) == c.referenced_files() == {
        "../legacy/dt=1/part-0.parquet", "dt=1/g_1.parquet", ".bucketindex/index/bucket=00000/delta_1.arrow"}


def test_unknown_keys_and_nulls_are_kept():
    meta = {"action": "commit", "instant": "2", "future_key": {"a": [1, 2]}, "engine": None, "counts": None,
            "file_groups": [{"partition": "p", "file_id": "f", "path": "p/f.parquet", "num_rows": 1, "size": 2,
                             "removed": False, "checksum": "abc", "base_rows": None}],
            "index": {"added": [{"bucket": 2, "path": "i/base.arrow", "entries": 1, "size": 3, "kind": "base",
                                 "sealed": True, "format": 2}], "removed": ["i/old.arrow"], "note": "x"},
            "engine_extra": 1}
    c = CommitMetadata.from_json(meta)
    assert c.to_json() == meta
    assert c.get("future_key") == {"a": [1, 2]} and c.engine is None and c.counts is None
    assert c.groups[0].extra == {"checksum": "abc", "base_rows": None}
    assert c.added[0] == IndexFileChange(bucket=2, path="i/base.arrow", entries=1, size=3, kind="base", sealed=True,
                                         extra={"format": 2})
    assert c.removed_index_files == ("i/old.arrow",) and c.index_extra == {"note": "x"}
    # other shapes: rollback and clean metadata, an empty index, an engine with more keys
    for other in ({"action": "rollback", "instant": "3", "rolled_back": "2", "target_action": "commit",
                   "deleted_files": ["a"]},
                  {"action": "clean", "counts": {"files": 2, "bytes": 9}, "earliest_retained_instant": "1"},
                  {"index": {}}, {"engine": {"name": "spark", "reason": "--master", "memory": 4}}, {}):
        assert CommitMetadata.from_json(other).to_json() == other
    assert CommitMetadata.from_json({"engine": {"name": "arrow", "reason": "r"}}).engine == EngineInfo(name="arrow",
                                                                                                    reason="r")


def test_constructed_by_keyword_and_frozen():
    with pytest.raises(TypeError):
        FileGroupChange("p", "f")  # type: ignore[misc]
    c = CommitMetadata(action="commit", batch_id="b", num_buckets=4,
                       file_groups=(FileGroupChange(partition="p", file_id="f", path="p/f.parquet", num_rows=1,
                                                    size=2, removed=False),),
                       index_added=(IndexFileChange(bucket=1, path="d.arrow", entries=1, size=1, kind="delta"),),
                       index_removed=(), counts={"inserted": 1})
    with pytest.raises(AttributeError):
        c.action = "x"  # type: ignore[misc]
    assert parse(c) is c and parse(c.to_json()) == c
    w = WriteSet.of("commit", c.to_json())
    assert w.file_groups == {("p", "f")} and w.index_deltas == {1: "d.arrow"} and w.adds_keys and w.num_buckets == 4
    with pytest.raises(ValueError):
        FileGroupChange.from_json({"partition": "p", "file_id": "f"})
