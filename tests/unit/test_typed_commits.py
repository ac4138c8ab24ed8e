"""Typed commits through ``Transaction`` (issue 37, item 4): every writer reports what it wrote
as a :class:`~spark_jobs.table.commit.Written` and the transaction builds the commit's
:class:`~spark_jobs.table.commit.CommitMetadata`; it also owns the repair before a write (rolling
back abandoned instants) and the one instant reservation that table services use too.

What the JSON on disk holds is unchanged: ``test_commit_metadata.py`` round-trips every entry
the product writes; here the new types, the protocol fields only the transaction sets, and
source checks that no writer builds commit metadata or reserves an instant by hand.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pyarrow as pa
import pytest

import spark_jobs
from spark_jobs.table.action.transaction import Transaction, reserve
from spark_jobs.table.commit import (
    NO_ROWS_CHANGED,
    CommitMetadata,
    EngineInfo,
    FileGroupChange,
    IndexFileChange,
    Written,
)
from spark_jobs.table.config import TableConfig
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action
from spark_jobs.table.view import encode_schema

pytestmark = pytest.mark.unit

PACKAGE = Path(spark_jobs.__file__).parent
SCHEMA = pa.schema([("id", pa.string()), ("v", pa.int64()), ("_bi_key", pa.string())])
#: keys only a commit's metadata carries beside ``action`` and ``instant`` (what ``show`` and
#: the state print name an action and an instant, with counts, never these)
COMMIT_KEYS = {"file_groups", "snapshot_seq", "operation", "conflicts", "deleted_files", "earliest_retained_seq",
               "index"}


def new_table(tmp_path: Path) -> Table:
    t = Table.open(str(tmp_path / "t"))
    t.create(TableConfig(record_key_fields=["id"], num_buckets=2))
    return t


def test_the_transaction_adds_what_only_the_protocol_knows(tmp_path):
    t = new_table(tmp_path)
    report = Written(operation="alter_schema", index_type="record", schema=encode_schema(SCHEMA), file_groups=[],
                     index_added=[], index_removed=[], counts=NO_ROWS_CHANGED, alter={"changes": ["add v"]})
    txn = Transaction(t, Action.COMMIT, {"operation": "alter_schema"})
    retried = {"attempt": 1, "with": "20260101000000000", "with_action": "commit", "reason": "schema"}
    done = txn.run(lambda view, retries: report, max_retries=0)
    meta = Table.load(t.uri).timeline.read_metadata(done.instant)
    assert meta == done.metadata == {
        "action": "commit", "instant": txn.ts, "operation": "alter_schema", "index_type": "record",
        "schema": encode_schema(SCHEMA), "snapshot_seq": txn.view.seq, "file_groups": [],
        "index": {"added": [], "removed": []}, "counts": dict(NO_ROWS_CHANGED), "conflicts": [],
        "alter": {"changes": ["add v"]}}
    # a table service records neither its snapshot (its plan holds it) nor conflicts (it never retries)
    svc = CommitMetadata.of(report, action=Action.COMPACTION, instant="2", conflicts=None)
    assert "snapshot_seq" not in svc.to_json() and "conflicts" not in svc.to_json()
    assert CommitMetadata.of(report, action="commit", instant="3", conflicts=[retried]).to_json()["conflicts"] == [
        retried]


def test_written_is_frozen_and_refuses_what_the_protocol_sets():
    w = Written(operation="compaction", file_groups=[FileGroupChange(partition="p /%", file_id="f", path="p/f.parquet",
                                                                      base_rows=3, size=9, compacted_logs=("l",))],
                index_added=[IndexFileChange(bucket=1, path="i/b.arrow", entries=3, size=4, kind="base", sealed=False)],
                index_removed=["i/d.arrow"], counts={"rows": 3}, engine=EngineInfo(name="arrow", reason="small"))
    assert isinstance(w.file_groups, tuple) and isinstance(w.index_removed, tuple)
    with pytest.raises(TypeError):
        w.counts["rows"] = 4  # type: ignore[index]
    with pytest.raises(AttributeError):
        w.operation = "x"  # type: ignore[misc]
    assert w.replace(counts={"rows": 4}).counts == {"rows": 4} and w.counts == {"rows": 3}
    # an engine's report in the JSON shape parses into the same report
    meta = CommitMetadata.of(w, action="compaction", instant="1").to_json()
    assert Written.from_json({k: v for k, v in meta.items() if k not in ("action", "instant")}) == w
    for owned in ({"instant": "1"}, {"snapshot_seq": 3}, {"conflicts": []}, {"batch_id": "b"},
                  {"rolled_back": "1"}):
        with pytest.raises(ValueError, match="commit protocol"):
            Written.from_json({"operation": "upsert", **owned})
    # every field of the report is a field of the metadata (CommitMetadata.of copies them by name)
    assert set(Written.__dataclass_fields__) <= set(CommitMetadata.__dataclass_fields__)
    assert not set(Written.PROTOCOL) & set(Written.__dataclass_fields__)


def test_what_one_kind_of_action_records_is_typed_and_read_as_before():
    rollback = {"action": "rollback", "instant": "3", "rolled_back": "2", "target_action": "commit",
                "deleted_files": ["a/ü b.parquet"]}
    c = CommitMetadata.from_json(rollback)
    assert (c.rolled_back, c.target_action, c.deleted_files, c.extra) == ("2", "commit", ("a/ü b.parquet",), {})
    assert c.get("rolled_back") == "2" and c.get("deleted_files") == ["a/ü b.parquet"] and c.get("nope", 1) == 1
    assert c.to_json() == rollback
    clean = {"action": "clean", "operation": "clean", "earliest_retained_seq": 4, "earliest_retained_instant": "9",
             "previous_retained_seq": 0, "policy": {"retain_commits": 1}, "counts": {"files": 2, "bytes": 9}}
    c = CommitMetadata.from_json(clean)
    assert (c.earliest_retained_seq, c.previous_retained_seq, dict(c.policy or {})) == (4, 0, {"retain_commits": 1})
    assert c.to_json() == clean and c.get("policy") == {"retain_commits": 1}
    # another JSON type than documented (or null) is kept verbatim, as every unknown shape is
    odd = {"action": "rehash", "previous_num_buckets": "8", "bootstrap": None, "session_start_ms": 12}
    c = CommitMetadata.from_json(odd)
    assert c.previous_num_buckets is None and c.extra == {"previous_num_buckets": "8", "bootstrap": None}
    assert c.session_start_ms == 12 and c.to_json() == odd and c.get("bootstrap", "d") is None


def test_begin_with_repair_rolls_back_abandoned_instants_first(tmp_path):
    t = new_table(tmp_path)
    dead = Transaction(t, Action.COMMIT, {"batch_id": "killed"}).begin()
    dead._heartbeat.stop()  # type: ignore[union-attr]  # its writer died (silent past the timeout below)
    t.create_marker(dead.ts, "orphan.parquet")
    before = t.view()
    bare = Transaction(t, Action.COMMIT, {"batch_id": "bare"}).begin()  # the bare protocol repairs nothing
    assert dead.ts in [i.timestamp for i in Table.load(t.uri).timeline.reload().pending()]
    bare.abort()
    txn = Transaction(t, Action.COMMIT, {"batch_id": "next"}, view=before, repair=True,
                      heartbeat_timeout_s=0).begin()
    tl = Table.load(t.uri).timeline.reload()
    assert dead.ts in tl.aborted and [i.timestamp for i in tl.pending()] == [txn.ts]
    assert t.marked_files(dead.ts) == [] and not Path(t.abs("orphan.parquet")).exists()
    assert txn.view is not None and txn.view.seq == tl.last_seq > before.seq, "planned after the rollback's entry"
    txn.abort()


def _dicts(path: Path) -> list[tuple[int, set[str]]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            out.append((node.lineno, keys))
    return out


def test_no_writer_builds_commit_metadata_by_hand():
    """A dict literal naming an ``action`` with keys of a commit is commit metadata built by
    hand: outside commit.py, every writer reports a ``Written`` and the transaction builds it."""
    found = [f"{p.relative_to(PACKAGE)}:{line}" for p in sorted(PACKAGE.rglob("*.py")) if p.name != "commit.py"
             for line, keys in _dicts(p) if {"action", "instant"} <= keys and keys & COMMIT_KEYS]
    assert found == []


def test_one_instant_reservation(tmp_path):
    """Writes and table-service plans reserve their instant in one place (transaction.reserve):
    no other module creates a requested instant except a rollback's own plan."""
    callers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     for node in ast.walk(ast.parse(p.read_text()))
                     if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                     and node.func.attr == "create_requested")
    assert callers == ["table/action/rollback.py", "table/action/transaction.py"]
    t = new_table(tmp_path)
    first = reserve(t, Action.COMPACTION, {"files": ["a b/ü.parquet"]})
    second = reserve(t, Action.COMPACTION, {"files": []})
    assert first.timestamp != second.timestamp
    assert t.timeline.read_plan(first)["files"] == ["a b/ü.parquet"]
