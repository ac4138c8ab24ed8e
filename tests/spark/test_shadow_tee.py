"""The tee (``upsert --shadow-index``): a second index tags the batch on the fly and the
disagreements go to the commit metadata and ``show``, while what is written stays what the
table's own index routes -- asserted by comparing each run with a run of the same batch on a
copy of the table without the flag.

One record table per module (odd partition values and keys); each test upserts into copies.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from spark_jobs.cli import main
from spark_jobs.exceptions import BadInputError
from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.describe import describe
from spark_jobs.table.table import Table
from tests.spark.conftest import tree_digest, write_batch
from tests.spark.test_shadow_compare import _location
from tests.spark.test_validate import add_index_delta, bucket_of_key

pytestmark = pytest.mark.spark

REGIONS = ["eu west/1", "us %2F+east", "亚太 ap"]
KEYS = [f"k{i:02d}" + (" /%+ключ" if i % 7 == 3 else "") for i in range(18)]
REGION_OF = {k: REGIONS[i % 3] for i, k in enumerate(KEYS)}
MOVER = KEYS[2]  # changes partition in the second batch
DELETED = KEYS[4]
UPDATED = KEYS[6:12]
NEW = ["new é/1", "new 2"]


def _rows(keys, ts, deleted=(), region=None):
    return [{"id": k, "region": (region or REGION_OF).get(k, REGIONS[0]), "ts": ts, "del": k in deleted}
            for k in keys]


def _opts(uri, src, index="record", shadow=None):
    return UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region",
                         index=index, num_buckets=2 if index == "bucket" else 4, delete_field="del",
                         shadow_index=shadow)


@pytest.fixture(scope="module")
def base(spark, tmp_path_factory):
    d = tmp_path_factory.mktemp("tee")
    uri = str(d / "record")
    run_upsert(spark, _opts(uri, write_batch(d / "b1.parquet", _rows(KEYS, 1))))
    moved = {MOVER: REGIONS[(KEYS.index(MOVER) + 1) % 3]}
    second = write_batch(d / "b2.parquet", _rows([MOVER, *UPDATED, DELETED, *NEW], 2, [DELETED],
                                                 region={**REGION_OF, **moved}))
    return uri, second


def _copy(uri: str, dest: Path) -> Table:
    shutil.copytree(uri, dest)
    return Table.load(str(dest))


def _written(t: Table):
    """The snapshot's rows, and each live file's partition and keys (file ids and names are random)."""
    rows = sorted(read_arrow(t.uri).to_pylist(), key=lambda r: r["id"])
    files = sorted((s.partition, tuple(sorted(pq.read_table(t.abs(s.path), columns=["_bi_key"]).column(0).to_pylist())))
                   for s in t.view().slices())
    return rows, files


def _tee_and_plain(spark, uri, src, tmp_path, shadow, fault=None):
    """Upsert ``src`` into two copies (with and without the tee, after ``fault``); the tee's record."""
    tee, plain = _copy(uri, tmp_path / "tee"), _copy(uri, tmp_path / "plain")
    if fault:
        fault(tee)
        fault(plain)
    result = run_upsert(spark, _opts(tee.uri, src, shadow=shadow))
    run_upsert(spark, _opts(plain.uri, src))
    tee, plain = Table.load(tee.uri), Table.load(plain.uri)
    assert _written(tee) == _written(plain)  # the tee changes nothing written
    meta = tee.timeline.read_metadata(tee.timeline.completed(["commit"])[-1])
    assert meta["shadow"] == result["shadow"]
    assert "shadow" not in plain.timeline.read_metadata(plain.timeline.completed(["commit"])[-1])
    return meta["shadow"], tee


def test_healthy_record_table_records_zero_disagreements(spark, base, tmp_path, capsys):
    uri, src = base
    sh, tee = _tee_and_plain(spark, uri, src, tmp_path, "global_simple")
    assert sh == {"shadow_index": "global_simple", "keys_compared": 2 + len(UPDATED) + len(NEW),
                  "compared": "location", "disagreements": {"missing": 0, "extra": 0, "wrong_location": 0},
                  "samples": {"missing": [], "extra": [], "wrong_location": []}}
    desc = describe(tee)["timeline"]
    assert [c.get("shadow") for c in desc if c["action"] == "commit"] == [None, sh]  # (compactions: none)
    assert not any(c.get("shadow") for c in desc if c["action"] != "commit")
    capsys.readouterr()
    assert main(["show", tee.uri], submitted=True) == 0
    out = capsys.readouterr().out
    assert "shadow global_simple: 10 keys compared, no disagreements" in out


def test_planted_index_faults_are_recorded_with_their_keys(spark, base, tmp_path, capsys):
    """A tombstone for a live key the batch updates (the record index misses it: the write
    inserts it again) and an entry sending another one into another partition's file group."""
    uri, src = base
    gone, astray = UPDATED[0], UPDATED[1]

    def fault(t: Table) -> None:
        add_index_delta(t, bucket_of_key(t, gone), [gone], [None])
        other = next(s for s in t.view().slices() if s.partition != _location(t, astray).partition)
        add_index_delta(t, bucket_of_key(t, astray), [astray], [(other.partition, other.file_id)])

    sh, tee = _tee_and_plain(spark, uri, src, tmp_path, "global_simple", fault)
    assert sh["disagreements"] == {"missing": 1, "extra": 0, "wrong_location": 1}, sh
    assert sh["samples"] == {"missing": [gone], "extra": [], "wrong_location": [astray]}, sh
    capsys.readouterr()
    assert main(["show", tee.uri], submitted=True) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "shadow global_simple" in x)
    assert "1 missing, 0 extra, 1 wrong_location" in line and repr(gone) in line and repr(astray) in line


def test_record_table_against_bucket_compares_partitions(spark, base, tmp_path):
    """A bucket index computed on the fly only knows the partition on a record table: an entry
    sending a key into another partition's file group disagrees, the healthy keys do not."""
    uri, src = base
    t = _copy(uri, tmp_path / "t")
    key = UPDATED[2]
    other = next(s for s in t.view().slices() if s.partition != _location(t, key).partition)
    add_index_delta(t, bucket_of_key(t, key), [key], [(other.partition, other.file_id)])
    batch = write_batch(tmp_path / "b.parquet", _rows([key, UPDATED[3], *NEW], 3))
    sh = run_upsert(spark, _opts(t.uri, batch, shadow="bucket"))["shadow"]
    assert sh["compared"] == "partition" and sh["keys_compared"] == 2 + len(NEW)
    assert sh["disagreements"] == {"missing": 0, "extra": 0, "wrong_location": 1}, sh
    assert sh["samples"]["wrong_location"] == [key]


def test_bucket_table_against_global_simple(spark, tmp_path):
    uri = str(tmp_path / "bucket")
    run_upsert(spark, _opts(uri, write_batch(tmp_path / "b1.parquet", _rows(KEYS, 1)), index="bucket"))
    src = write_batch(tmp_path / "b2.parquet", _rows([*UPDATED, *NEW], 2))
    sh = run_upsert(spark, _opts(uri, src, index="bucket", shadow="global_simple"))["shadow"]
    assert sh["compared"] == "file_group" and sh["keys_compared"] == len(UPDATED) + len(NEW)
    assert sum(sh["disagreements"].values()) == 0, sh


@pytest.mark.parametrize("index, shadow, message", [
    ("global_simple", "global_simple", "compares the index with itself"),
    ("bucket", "bucket", "compares the index with itself"),
    ("global_simple", "bucket", "needs hash-bucketed file groups"),
])
def test_bad_combinations_exit_2_and_write_nothing(base, tmp_path, capsys, index, shadow, message):
    uri, src = base
    new = tmp_path / "new"
    argv = ["upsert", str(new), src, "--record-key", "id", "--partition-field", "region", "--delete-field", "del",
            "--index", index, "--shadow-index", shadow]
    capsys.readouterr()
    assert main(argv, submitted=True) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not new.exists()


def test_shadow_equal_to_an_existing_tables_index_is_refused(spark, base, tmp_path, capsys):
    uri, src = base
    t = _copy(uri, tmp_path / "t")
    digest = tree_digest(Path(t.uri))
    with pytest.raises(BadInputError, match="compares the index with itself"):
        run_upsert(spark, _opts(t.uri, src, shadow="record"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # argparse's choices: one line, exit 2
        main(["upsert", t.uri, src, "--record-key", "id", "--shadow-index", "record"], submitted=True)
    assert e.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
    assert tree_digest(Path(t.uri)) == digest


def _index_answers(t: Table, keys: list[str]) -> dict[str, tuple[str, str] | None]:
    """The record index's answer for each key (partition, file id; None: absent)."""
    from spark_jobs.index.hashing import bucket_of
    from spark_jobs.index.record_index import lookup

    view, out = t.view(), {}
    for k in keys:
        files = view.index_files.get(bucket_of(k, t.num_buckets()), [])
        out[k] = lookup(t.io, [t.abs(p) for p in files], [k]).target(0) if files else None
    return out


@pytest.mark.parametrize("index, shadow, faulty", [
    ("record", "global_simple", True), ("record", "bucket", True), ("bucket", "global_simple", False)])
def test_arrow_tee_equals_spark_tee(spark, tmp_path, index, shadow, faulty):
    """The same batch through ``--engine arrow`` and ``--engine spark`` with the tee, on copies of
    one table (with the same planted index faults): the same snapshot and files, the same index,
    the same ``shadow`` record key for key."""
    from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert

    uri = str(tmp_path / "base")
    arrow_upsert(_opts(uri, write_batch(tmp_path / "b1.parquet", _rows(KEYS, 1)), index=index))
    moved = {MOVER: REGIONS[(KEYS.index(MOVER) + 1) % 3]}
    src = write_batch(tmp_path / "b2.parquet", _rows([MOVER, *UPDATED, DELETED, *NEW], 2, [DELETED],
                                                     region={**REGION_OF, **moved}))
    tables = {e: _copy(uri, tmp_path / e) for e in ("spark", "arrow")}
    if faulty:  # a tombstone for a live key the batch updates, an entry sending another one astray
        gone, astray = UPDATED[0], UPDATED[1]
        for t in tables.values():
            add_index_delta(t, bucket_of_key(t, gone), [gone], [None])
            other = next(s for s in t.view().slices() if s.partition != _location(t, astray).partition)
            add_index_delta(t, bucket_of_key(t, astray), [astray], [(other.partition, other.file_id)])
    got = {"spark": run_upsert(spark, _opts(tables["spark"].uri, src, index=index, shadow=shadow))["shadow"],
           "arrow": arrow_upsert(_opts(tables["arrow"].uri, src, index=index, shadow=shadow))["shadow"]}
    assert got["arrow"] == got["spark"]
    if faulty:
        assert sum(got["arrow"]["disagreements"].values()) >= 1, got
    loaded = {e: Table.load(t.uri) for e, t in tables.items()}
    assert _written(loaded["arrow"]) == _written(loaded["spark"])
    for e, t in loaded.items():
        assert t.timeline.read_metadata(t.timeline.completed(["commit"])[-1])["shadow"] == got[e]
    if index == "record":
        everyone = [*KEYS, *NEW]
        assert _index_answers(loaded["arrow"], everyone) == _index_answers(loaded["spark"], everyone)
