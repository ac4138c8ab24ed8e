"""``shadow-compare``'s bad input: exit 2 with one line, no report and nothing written, before a
Spark session starts -- on a record and a bucket table the in-process Arrow engine wrote (the
same tables as tests/spark/test_shadow_compare.py, which imports them from here and runs the
comparisons on Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.cli import main
from spark_jobs.table.action.upsert import UpsertOptions
from tests.unit.test_arrow_oracle_upsert import tree_digest, write_batch

pytestmark = pytest.mark.unit

REGIONS = ["eu west/1", "us %2F+east", "亚太 ap"]
KEYS = [f"k{i:02d}" + (" /%+ключ" if i % 7 == 3 else "") for i in range(24)]
REGION_OF = {k: REGIONS[i % 3] for i, k in enumerate(KEYS)}
DELETED = KEYS[4]
UPDATED = KEYS[8:14]


def _rows(keys, ts, deleted=()):  # type: ignore[no-untyped-def]
    return [{"id": k, "region": REGION_OF.get(k, REGIONS[0]), "ts": ts, "del": k in deleted} for k in keys]


def _upsert(uri, src, index):  # type: ignore[no-untyped-def]
    """An upsert on the Arrow engine, in this process. Copy-on-write: the faults these tests
    plant go into base files, where such a table holds every row, and ``--since`` counts the
    upsert's own commit only (merge-on-read shadow comparison: tests/unit/test_arrow_shadow_compare.py)."""
    run_upsert(UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts",
                             partition_field="region", index=index, num_buckets=2 if index == "bucket" else 4,
                             delete_field="del", table_type="copy_on_write"))


def make_tables(base: Path) -> dict[str, str]:
    """One record and one bucket table under ``base``: inserts, then updates and a delete."""
    out = {}
    for index in ("record", "bucket"):
        uri = str(base / index)
        _upsert(uri, write_batch(base / f"{index}-1.parquet", _rows(KEYS, 1)), index)
        _upsert(uri, write_batch(base / f"{index}-2.parquet", _rows([*UPDATED, DELETED], 2, [DELETED])), index)
        out[index] = uri
    return out


@pytest.fixture(scope="module")
def tables(tmp_path_factory):  # type: ignore[no-untyped-def]
    return make_tables(tmp_path_factory.mktemp("shadow"))


def _cli(uri, *extra):  # type: ignore[no-untyped-def]
    return main(["shadow-compare", uri, *extra], submitted=True)


@pytest.mark.parametrize("args, message", [
    (["--sample-fraction", "0"], "--sample-fraction must be in (0, 1]"),
    (["--sample-fraction", "1.5"], "--sample-fraction must be in (0, 1]"),
    (["--max-mismatches", "-1"], "--max-mismatches must be 0 or more"),
    (["--since", "yesterday"], "--since must be an instant"),
    (["--against", "bucket", "@bucket"], "compares the index with itself"),
    (["--against", "nosuch"], "invalid choice"),
    (["@missing"], "no bucketindex table at"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tables, tmp_path, capsys, monkeypatch, args, message):
    # told before a JVM starts: a Spark session made here fails the test
    monkeypatch.setattr("spark_jobs.cli._spark", lambda *a: pytest.fail("shadow-compare started a Spark session"))
    uri = tables["record"]
    if "@bucket" in args:
        args, uri = [a for a in args if a != "@bucket"], tables["bucket"]
    if "@missing" in args:
        args, uri = [], str(tmp_path / "nothing")
    digest = tree_digest(tmp_path)
    before = tree_digest(Path(tables["record"]))
    if "nosuch" in args:  # argparse's own one-line error
        with pytest.raises(SystemExit) as e:
            _cli(uri, *args, "--report", str(tmp_path / "r.json"))
        rc = e.value.code
    else:
        rc = _cli(uri, *args, "--report", str(tmp_path / "r.json"))
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bucketindex: error:") and message in err[0], err
    assert tree_digest(tmp_path) == digest  # no report written
    assert tree_digest(Path(tables["record"])) == before
