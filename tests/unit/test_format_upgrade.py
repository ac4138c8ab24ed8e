"""The format gate of schema evolution and partial logs (format.md §9): a table is upgraded to
format version 4 by the first writer whose files or schema an older release would misread, and
only then, so tables that never use those features stay readable by older releases.

A release that knows only versions 2 and 3 refuses a version-4 table at load ("a reader MUST
refuse a version it does not know"); that refusal is what protects a mixed fleet, so these
tests check when the version moves and that this release refuses a version it does not know.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.exceptions import BadInputError
from spark_jobs.table.action.alter import run_alter
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.config import EVOLVING_FORMAT_VERSION, FORMAT_VERSION, TableConfig
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table

pytestmark = pytest.mark.unit

KEYS = ["a b/1", "é%+2", "東京 3"]


def _batch(tmp_path: Path, name: str, **columns: list) -> str:
    path = tmp_path / f"{name}.parquet"
    pq.write_table(pa.table(columns), path)
    return str(path)


def _version(uri: str) -> int:
    return json.loads((Path(uri) / ".bucketindex" / "table.json").read_text())["format_version"]


def _upsert(uri: str, src: str, batch_id: str, **kw) -> dict:  # type: ignore[no-untyped-def]
    return run_upsert(UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts",
                                    batch_id=batch_id, **kw))


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_plain_writes_keep_version_2_and_an_alter_upgrades(tmp_path, table_type):
    uri = str(tmp_path / "t")
    _upsert(uri, _batch(tmp_path, "b1", id=KEYS, ts=[1, 1, 1], v=["x", "y", "z"]), "b1", table_type=table_type)
    _upsert(uri, _batch(tmp_path, "b2", id=KEYS[:1], ts=[2], v=["x2"]), "b2")
    assert _version(uri) == FORMAT_VERSION
    before = Table.load(uri).timeline.reload().last_seq
    run_alter(uri, add_columns=["note:string"])
    assert _version(uri) == EVOLVING_FORMAT_VERSION
    assert Table.load(uri).timeline.reload().last_seq == before + 1
    # the upgraded table reads and writes as before, the new column null on old rows
    _upsert(uri, _batch(tmp_path, "b3", id=KEYS[1:2], ts=[3], v=["y3"], note=["n é"]), "b3")
    got = {r["id"]: (r["v"], r["note"]) for r in read_arrow(uri).to_pylist()}
    assert got == {KEYS[0]: ("x2", None), KEYS[1]: ("y3", "n é"), KEYS[2]: ("z", None)}


def test_an_evolving_batch_upgrades_and_a_refused_one_does_not(tmp_path):
    uri = str(tmp_path / "t")
    _upsert(uri, _batch(tmp_path, "b1", id=KEYS, ts=[1, 1, 1], v=["x", "y", "z"]), "b1")
    with pytest.raises(BadInputError):  # a new column without --schema-evolution: nothing written
        _upsert(uri, _batch(tmp_path, "b2", id=KEYS[:1], ts=[2], v=["x2"], extra=[1]), "b2")
    assert _version(uri) == FORMAT_VERSION
    _upsert(uri, _batch(tmp_path, "b3", id=KEYS[:1], ts=[2], v=["x2"], extra=[1]), "b3",
            schema_evolution="add-columns")
    assert _version(uri) == EVOLVING_FORMAT_VERSION


@pytest.mark.parametrize("table_type, upgraded", [("copy_on_write", False), ("merge_on_read", True)])
def test_only_a_partial_log_upgrades(tmp_path, table_type, upgraded):
    """Copy-on-write partial updates write whole rows an older release reads correctly; a
    merge-on-read partial log would read as nulls there, so it upgrades the table first."""
    uri = str(tmp_path / "t")
    _upsert(uri, _batch(tmp_path, "b1", id=KEYS, ts=[1, 1, 1], v=["x", "y", "z"], w=[1, 2, 3]), "b1",
            table_type=table_type)
    _upsert(uri, _batch(tmp_path, "b2", id=KEYS[:1], ts=[2], w=[10]), "b2", partial_update=True)
    assert _version(uri) == (EVOLVING_FORMAT_VERSION if upgraded else FORMAT_VERSION)
    assert {r["id"]: (r["v"], r["w"]) for r in read_arrow(uri).to_pylist()}[KEYS[0]] == ("x", 10)


def test_a_version_this_release_does_not_know_is_refused_in_one_line(tmp_path):
    uri = str(tmp_path / "t")
    _upsert(uri, _batch(tmp_path, "b1", id=KEYS, ts=[1, 1, 1]), "b1")
    cfg = Path(uri) / ".bucketindex" / "table.json"
    raw = json.loads(cfg.read_text())
    raw["format_version"] = EVOLVING_FORMAT_VERSION + 1
    cfg.write_text(json.dumps(raw))
    with pytest.raises(BadInputError, match=r"table format version 5 is not supported by this release"):
        Table.load(uri)


def test_version_4_holds_reference_tables_too():
    ref = {"source": "/legacy/orders", "path_columns": {"region": "string"}}
    assert TableConfig(record_key_fields=["id"], format_version=EVOLVING_FORMAT_VERSION, reference=ref).reference
    assert TableConfig(record_key_fields=["id"], format_version=EVOLVING_FORMAT_VERSION).reference is None
    with pytest.raises(BadInputError, match="needs reference files"):
        TableConfig(record_key_fields=["id"], format_version=3)
