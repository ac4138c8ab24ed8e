"""``validate`` in-process within a memory budget (issue 38, "memory bounded by design"): a
snapshot over the budget is checked in P partitions spilled to Arrow IPC files, and the report
is the one P = 1 gives -- the same counts and the same samples -- whatever the problems.

Tables are hand-made commits (as in test_table_format: real Parquet and real index files, with
the problems a bug or a user's hand would leave) or written by the Arrow upsert; keys and
partitions hold spaces, ``/``, ``%``, ``+``, non-ASCII and ``""``, values null."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine import validate as arrow_validate
from spark_jobs.arrow_engine.validate import bounded_bytes, needed_bytes, plan, run_validate, stream_bytes
from spark_jobs.index.hashing import bucket_of
from spark_jobs.index.record_index import IndexEntries, write_index_file
from spark_jobs.table.action.engine import choose_engine
from spark_jobs.table.config import TableConfig
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action
from spark_jobs.table.view import encode_schema

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("id", pa.string()), ("v", pa.int64()), ("_bi_key", pa.string())])
NB = 4
#: partitions as a commit names them: encoded directory names, the null value's, and none
PARTS = ["region=south east", "region=x%2Fy", "region=a+b", "region=s%C3%A3o paulo", "region=東京",
         "region=__HIVE_DEFAULT_PARTITION__", ""]
SHAPES = ["k {}", "k+{}", "k%{}", "k/{}", "chave-ção-{}", "鍵{}", "{}"]


def key(i: int) -> str:
    return SHAPES[i % len(SHAPES)].format(i)


def commit(t: Table, groups: list[tuple[str, str, list[str]]], entries: list[tuple[int, str, str, str]],
           *, recorded: dict[tuple[str, str], int] | None = None) -> None:
    """One hand-made commit: ``groups`` (partition, file id, keys) as Parquet files (``v`` null
    on every third row), ``entries`` (bucket, key, partition, file id) as record-index files,
    and ``recorded`` row counts where they differ from the files'."""
    tl = t.timeline
    inst = tl.transition_to_inflight(tl.create_requested(Action.COMMIT, {"batch_id": f"b-{len(tl.instants)}"}))
    meta = []
    for n, (part, fid, keys) in enumerate(groups):
        rel = f"d{n}/{fid}_0-0-0_{inst.timestamp}.parquet"
        os.makedirs(os.path.dirname(t.abs(rel)), exist_ok=True)
        t.create_marker(inst.timestamp, rel)
        pq.write_table(pa.table({"id": keys, "v": [None if i % 3 == 0 else i for i in range(len(keys))],
                                 "_bi_key": keys}, schema=SCHEMA), t.abs(rel))
        meta.append({"partition": part, "file_id": fid, "path": rel,
                     "num_rows": (recorded or {}).get((part, fid), len(keys))})
    added = []
    for b in sorted({e[0] for e in entries}):
        mine = [e for e in entries if e[0] == b]
        path = t.layout.index_file(b, "delta", inst.timestamp)
        t.create_marker(inst.timestamp, t.layout.rel(path))
        write_index_file(t.io, path, IndexEntries.from_keys([k for _, k, _, _ in mine],
                                                            [(p, f) for _, _, p, f in mine]))
        added.append({"bucket": b, "path": t.layout.rel(path), "kind": "delta"})
    tl.complete(inst, {"batch_id": f"b-{inst.timestamp}", "schema": encode_schema(SCHEMA), "file_groups": meta,
                       "index": {"added": added}})


def broken_record_table(tmp_path, n: int = 420) -> tuple[Table, dict[str, int]]:
    """A record-index table with every kind of row <-> entry problem, each more than SAMPLES
    times (samples come from several partitions); returns it and the expected counts."""
    t = Table.open(str(tmp_path / "record"))
    t.create(TableConfig(record_key_fields=["id"], num_buckets=NB))
    keys = [key(i) for i in range(n)]
    groups: dict[tuple[str, str], list[str]] = {}
    entries = []
    want = {"keys_missing_from_index": 0, "index_entries_without_row": 0, "index_points_to_wrong_file": 0,
            "index_entries_in_wrong_bucket": 0, "duplicate_keys": 0}
    for i, k in enumerate(keys):
        part, fid = PARTS[i % len(PARTS)], f"fg{i % 3}"
        groups.setdefault((part, fid), []).append(k)
        b, loc = bucket_of(k, NB), (part, fid)
        if i % 11 == 1:
            want["keys_missing_from_index"] += 1
            continue
        if i % 11 == 2:
            loc = (PARTS[(i + 1) % len(PARTS)], fid)  # another partition
            want["index_points_to_wrong_file"] += 1
        elif i % 11 == 3:
            loc = (part, "fg-gone")  # a file group the view lacks
            want["index_points_to_wrong_file"] += 1
        elif i % 11 == 4:
            b = (b + 1) % NB
            want["index_entries_in_wrong_bucket"] += 1
        elif i % 11 == 5:
            groups.setdefault((PARTS[(i + 2) % len(PARTS)], "fg-dup"), []).append(k)  # a copy elsewhere
            want["duplicate_keys"] += 1
            want["index_points_to_wrong_file"] += 1  # the copy's row: its entry names the other group
        entries.append((b, k, *loc))
    for i in range(9):  # entries whose key no row has
        ghost = f"ghost {i}/é%+"
        entries.append((bucket_of(ghost, NB), ghost, PARTS[i % len(PARTS)], "fg0"))
        want["index_entries_without_row"] += 1
    groups.setdefault(("", "fg0"), []).append("")  # the empty key, indexed
    entries.append((bucket_of("", NB), "", "", "fg0"))
    recorded = {(PARTS[0], "fg0"): 999, (PARTS[1], "fg1"): 1}
    commit(t, [(p, f, ks) for (p, f), ks in groups.items()], entries, recorded=recorded)
    want["row_count_mismatch"] = len(recorded)
    return Table.load(t.uri), want


def broken_bucket_table(tmp_path, index_type: str = "bucket") -> Table:
    """A bucket-index table with rows in the wrong bucket and duplicates (the same key in one
    partition twice, and once in another partition: not a duplicate there); the same files as a
    ``global_simple`` table (whose duplicates are keys, whatever their partition)."""
    t = Table.open(str(tmp_path / index_type))
    t.create(TableConfig(record_key_fields=["id"], num_buckets=NB, index_type=index_type))
    groups: dict[tuple[str, str], list[str]] = {}
    for i in range(300):
        k = key(i)
        b = bucket_of(k, NB) if i % 7 else (bucket_of(k, NB) + 1) % NB  # every 7th: wrong bucket
        part = PARTS[i % len(PARTS)]
        groups.setdefault((part, f"{b:08d}"), []).append(k)
        if i % 13 == 0:
            groups.setdefault((part, f"{bucket_of(k, NB):08d}"), []).append(k)  # a duplicate
        if i % 17 == 0:
            groups.setdefault((PARTS[(i + 1) % len(PARTS)], f"{bucket_of(k, NB):08d}"), []).append(k)
    commit(t, [(p, f, ks) for (p, f), ks in groups.items()], [])
    return Table.load(t.uri)


@pytest.mark.parametrize("partitions", [2, 3, 7, 32])
def test_record_index_report_is_the_same_in_any_number_of_partitions(tmp_path, partitions):
    t, want = broken_record_table(tmp_path)
    whole = arrow_validate._validate(t, t.view())
    assert {name: p["count"] for name, p in whole["problems"].items()} == want
    assert all(len(p["samples"]) == 5 for p in whole["problems"].values() if p["count"] >= 5)
    spill = tmp_path / "spill"
    spill.mkdir()
    assert arrow_validate._validate(t, t.view(), partitions=partitions, spill_dir=str(spill)) == whole
    assert os.listdir(spill) == []


@pytest.mark.parametrize("partitions", [2, 5, 32])
def test_bucket_index_report_is_the_same_in_any_number_of_partitions(tmp_path, partitions):
    t = broken_bucket_table(tmp_path)
    whole = arrow_validate._validate(t, t.view())
    assert set(whole["problems"]) == {"rows_in_wrong_bucket", "duplicate_keys"}
    assert whole["problems"]["rows_in_wrong_bucket"]["count"] == len(range(0, 300, 7))  # the copies sit right
    assert whole["problems"]["duplicate_keys"]["count"] == len(range(0, 300, 13))
    assert arrow_validate._validate(t, t.view(), partitions=partitions, spill_dir=str(tmp_path)) == whole


@pytest.mark.parametrize("partitions", [3, 32])
def test_global_simple_report_is_the_same_in_any_number_of_partitions(tmp_path, partitions):
    t = broken_bucket_table(tmp_path, "global_simple")
    whole = arrow_validate._validate(t, t.view())
    assert set(whole["problems"]) == {"duplicate_keys"}
    assert whole["problems"]["duplicate_keys"]["count"] == len([i for i in range(300) if i % 13 == 0 or i % 17 == 0])
    assert arrow_validate._validate(t, t.view(), partitions=partitions, spill_dir=str(tmp_path)) == whole


def test_unreadable_index_file_is_left_out_in_every_partition(tmp_path):
    """A bucket whose index file is damaged: its keys are not compared with entries, whichever
    partition they land in; the other buckets are."""
    t, _ = broken_record_table(tmp_path)
    victim = sorted(t.view().index_files)[0]
    with open(t.abs(t.view().index_files[victim][0]), "wb") as f:
        f.write(b"not an index file")
    whole = arrow_validate._validate(t, t.view())
    assert "index_files_unreadable" in whole["problems"]
    assert arrow_validate._validate(t, t.view(), partitions=6, spill_dir=str(tmp_path)) == whole


def test_a_small_budget_partitions_and_auto_stays_in_process(tmp_path):
    """The budget decides P: within it, one partition and no spill; under it, P partitions whose
    peak (``bounded_bytes``) fits, so ``auto`` keeps validate in process; only a budget below the
    largest slice and index bucket (``stream_bytes``) sends it to Spark."""
    t, _ = broken_record_table(tmp_path)
    view = t.view()
    whole = needed_bytes(t, view)
    assert plan(t, view, whole) == arrow_validate.Plan(1, whole)
    budget = stream_bytes(t, view) + whole // 5
    small = plan(t, view, budget)
    assert small.partitions > 1 and small.needed <= budget < whole
    assert bounded_bytes(t, view, budget) == small.needed
    assert choose_engine(requested="auto", needed_bytes=small.needed, budget=budget, announce=False).engine == "arrow"
    floor = stream_bytes(t, view)
    assert choose_engine(requested="auto", needed_bytes=bounded_bytes(t, view, floor), budget=floor,
                         announce=False).engine == "spark"
    assert run_validate(t.uri, memory_budget=budget, spill_dir=str(tmp_path)) == run_validate(t.uri)


def test_the_cli_validates_over_its_budget_in_process(tmp_path, capsys, caplog):
    """``bucketindex validate --memory-budget`` below what one partition of the whole needs: in
    process (no JVM), partitioned, the same report and exit status as with a large budget."""
    import json

    from spark_jobs.cli import main

    t, _ = broken_record_table(tmp_path)
    budget = stream_bytes(t, t.view()) + needed_bytes(t, t.view()) // 4
    assert main(["validate", t.uri, "--memory-budget", "64g"]) == 1
    big = json.loads(capsys.readouterr().out)
    with caplog.at_level("INFO"):
        assert main(["validate", t.uri, "--memory-budget", str(budget)]) == 1
    assert json.loads(capsys.readouterr().out) == big
    logged = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("engine: arrow (needs about") for m in logged)
    assert any(m.startswith("validate: partition 1 of ") for m in logged)


def test_spill_files_are_removed_after_an_error(tmp_path, monkeypatch):
    t, _ = broken_record_table(tmp_path)
    spill = tmp_path / "spill"
    spill.mkdir()
    seen = []

    def failing(found, rows, entries):
        seen.extend(os.listdir(spill / os.listdir(spill)[0]))  # the partitions not yet checked
        raise OSError("disk went away")

    monkeypatch.setattr(arrow_validate, "_check_record_index", failing)
    with pytest.raises(OSError, match="disk went away"):
        arrow_validate._validate(t, t.view(), partitions=4, spill_dir=str(spill))
    assert len(seen) == 6  # rows and entries of partitions 2..4: partition 1's were read and removed
    assert os.listdir(spill) == []


_PEAK = """
import sys
import pyarrow as pa
from spark_jobs.arrow_engine import validate
from spark_jobs.table.table import Table
t = Table.load(sys.argv[1])
report = validate._validate(t, t.view(), partitions=int(sys.argv[2]), spill_dir=sys.argv[3])
assert report["ok"] and report["rows"] == int(sys.argv[4]), report
print(pa.default_memory_pool().max_memory())
"""


def test_peak_arrow_memory_falls_with_the_partitions(tmp_path):
    """A clean 240k-row table in many file groups: the Arrow memory held at the peak (the pool's
    high-water mark, each run a fresh process) of 8 partitions is under half of what one holds."""
    t = Table.open(str(tmp_path / "big"))
    t.create(TableConfig(record_key_fields=["id"], num_buckets=NB))
    n, files = 240_000, 24
    keys = [f"key {i:07d}/é%+" for i in range(n)]
    per = n // files
    groups = [(PARTS[g % len(PARTS)], f"fg{g}", keys[g * per:(g + 1) * per]) for g in range(files)]
    commit(t, groups, [(bucket_of(k, NB), k, p, f) for p, f, ks in groups for k in ks])

    def peak(partitions: int) -> int:
        out = subprocess.run([sys.executable, "-c", _PEAK, t.uri, str(partitions), str(tmp_path), str(n)],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        return int(out.stdout.split()[-1])

    one, eight = peak(1), peak(8)
    assert eight < one / 2, (one, eight)
    assert [p for p in os.listdir(tmp_path) if p.startswith("bucketindex-validate-")] == []
