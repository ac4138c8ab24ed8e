"""The type of a new table (issue 38 item 1, "defaults that win"): merge-on-read with automatic
compaction unless asked otherwise; copy-on-write when the table is created with a projection;
tables written before this default keep what they recorded.

Each case goes through the CLI's own parser and entry point (``spark_jobs.cli.main``), as a user
runs it, and reads back ``table.json`` and the table's rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.cli import main
from spark_jobs.table import Action, Table
from spark_jobs.table.config import COPY_ON_WRITE, MERGE_ON_READ, new_auto_compact, new_table_type
from spark_jobs.table.reader import read_arrow
from tests.oracle import reduce_batches, rows_by_identity

pytestmark = pytest.mark.unit

KEYS = ["a /1", "b%2B", "ç+3", "", "d" * 300]


def _batch(tmp_path: Path, name: str, ts: int, keys: list[str] = KEYS) -> tuple[str, list[dict]]:
    rows = [{"id": k or "empty-key", "region": ["eu west", None, "sã/o"][i % 3], "ts": ts, "v": f"{name}-{i}"}
            for i, k in enumerate(keys)]
    path = tmp_path / f"{name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path), rows


def _upsert(uri: str, src: str, batch_id: str, *extra: str) -> None:
    assert main(["upsert", uri, src, "--record-key", "id", "--precombine-field", "ts", "--partition-field",
                 "region", "--batch-id", batch_id, "--engine", "arrow", *extra]) == 0


def _table_json(uri: str) -> dict:
    return json.loads((Path(uri) / ".bucketindex" / "table.json").read_text())


def test_a_new_table_is_merge_on_read_and_compacts_itself(tmp_path):
    uri = str(tmp_path / "t")
    src, rows = _batch(tmp_path, "b0", 0)
    _upsert(uri, src, "b0")
    raw = _table_json(uri)
    assert raw["table_type"] == MERGE_ON_READ and raw["auto_compact"] is True
    batches = [rows]
    # small batches over the same keys: every upsert appends a log; the table's own setting (no
    # flag on these upserts) folds each group once the compaction rule finds it due
    for b in range(1, 9):
        src, rows = _batch(tmp_path, f"b{b}", b)
        batches.append(rows)
        _upsert(uri, src, f"b{b}")
    t = Table.load(uri)
    assert t.timeline.completed([Action.COMPACTION]), "the upserts compacted without being asked"
    assert max(len(s.logs) for s in t.view().slices()) < 4, "no group keeps a due backlog"
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(uri)["ok"]


def test_a_table_created_with_a_mirror_is_copy_on_write(tmp_path):
    uri = str(tmp_path / "t")
    src, rows = _batch(tmp_path, "b0", 0)
    _upsert(uri, src, "b0", "--mirror", "delta")
    raw = _table_json(uri)
    assert raw["table_type"] == COPY_ON_WRITE and "auto_compact" not in raw
    # asked for, merge-on-read with a mirror is still given
    uri2 = str(tmp_path / "t2")
    _upsert(uri2, src, "b0", "--mirror", "delta", "--table-type", "merge_on_read")
    assert _table_json(uri2)["table_type"] == MERGE_ON_READ and _table_json(uri2)["auto_compact"] is True


def test_off_and_copy_on_write_are_recorded_when_asked(tmp_path):
    src, _ = _batch(tmp_path, "b0", 0)
    _upsert(str(tmp_path / "off"), src, "b0", "--auto-compact", "off")
    assert _table_json(str(tmp_path / "off"))["auto_compact"] is False
    _upsert(str(tmp_path / "cow"), src, "b0", "--table-type", "copy_on_write")
    raw = _table_json(str(tmp_path / "cow"))
    assert raw["table_type"] == COPY_ON_WRITE and "auto_compact" not in raw


def test_an_older_table_keeps_its_type_and_does_not_start_compacting(tmp_path):
    """A table.json written before merge-on-read existed has no ``table_type`` (copy-on-write);
    one written before this default has no ``auto_compact`` (off). Neither changes by an upsert."""
    src, rows = _batch(tmp_path, "b0", 0)
    old_cow, old_mor = str(tmp_path / "cow"), str(tmp_path / "mor")
    _upsert(old_cow, src, "b0", "--table-type", "copy_on_write")
    _upsert(old_mor, src, "b0", "--auto-compact", "off")
    for uri, drop in ((old_cow, "table_type"), (old_mor, "auto_compact")):
        raw = _table_json(uri)
        del raw[drop]  # as an older release wrote it
        (Path(uri) / ".bucketindex" / "table.json").write_text(json.dumps(raw, indent=2, sort_keys=True))
    batches = [rows]
    for b in range(1, 7):
        src, rows = _batch(tmp_path, f"b{b}", b)
        batches.append(rows)
        _upsert(old_cow, src, f"b{b}")
        _upsert(old_mor, src, f"b{b}")
    assert Table.load(old_cow).config.table_type == COPY_ON_WRITE
    assert all(not s.logs for s in Table.load(old_cow).view().slices())
    mor = Table.load(old_mor)
    assert mor.config.table_type == MERGE_ON_READ and mor.config.auto_compact is None
    assert not mor.timeline.completed([Action.COMPACTION])
    assert max(len(s.logs) for s in mor.view().slices()) >= 4, "logs accumulate, as before"
    for uri in (old_cow, old_mor):
        assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)


def test_the_rule_itself():
    assert new_table_type(table_type=None, mirrors=[]) == MERGE_ON_READ
    assert new_table_type(table_type=None, mirrors=["iceberg"]) == COPY_ON_WRITE
    assert new_table_type(table_type=COPY_ON_WRITE, mirrors=[]) == COPY_ON_WRITE
    assert new_auto_compact(table_type=MERGE_ON_READ, auto_compact=None) is True
    assert new_auto_compact(table_type=MERGE_ON_READ, auto_compact="off") is False
    assert new_auto_compact(table_type=COPY_ON_WRITE, auto_compact=None) is None


def test_a_reference_bootstrap_takes_the_same_default(tmp_path):
    src_dir = tmp_path / "legacy"
    src_dir.mkdir()
    pq.write_table(pa.table({"id": ["x 1", "y/2"], "ts": [1, 1], "v": ["a", "b"]}), src_dir / "part-0.parquet")
    uri = str(tmp_path / "t")
    assert main(["bootstrap", uri, str(src_dir), "--record-key", "id", "--precombine-field", "ts",
                 "--engine", "arrow"]) == 0
    raw = _table_json(uri)
    assert raw["table_type"] == MERGE_ON_READ and raw["auto_compact"] is True
    assert sorted(r["id"] for r in read_arrow(uri).to_pylist()) == ["x 1", "y/2"]
