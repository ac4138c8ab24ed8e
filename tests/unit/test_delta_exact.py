"""Issue 36 items 1 and 4: the Delta projection reads back every value exactly, and
``mirror --repair`` finds and fixes a damaged log.

Item 1: Delta and Hive readers read an empty partition value as null, so a string partition
field published through ``partitionValues`` loses ``""``. Every value the table accepts must
read back exactly through ``deltalake`` -- ``to_pyarrow_table``, its ``filters`` (which prune
files on the statistics the projection writes) and the DataFusion ``QueryBuilder``.

Item 4: the log is derived, so ``mirror --repair`` compares every retained version with what
the timeline projects and rewrites what differs (truncated, garbage, or written before the
projection changed), saying what it rewrote.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from spark_jobs.cli import main
from spark_jobs.table import Table, delta
from spark_jobs.table.reader import read_arrow

deltalake = pytest.importorskip("deltalake")

pytestmark = pytest.mark.unit

#: every kind of string partition value the table accepts: null and "" apart, the literals
#: Hive and this table use for null, a value whose directory name is shortened, odd characters
COUNTRIES = [None, "", "__NULL__", "__HIVE_DEFAULT_PARTITION__", "é" * 150 + " long", "são paulo", "日本",
             "a/b %2F+c=d e", "=", "%", " "]
ARGS = ["--record-key", "id", "--precombine-field", "ts", "--engine", "arrow"]


def _write(tmp: Path, name: str, rows: list[dict], schema: pa.Schema | None = None) -> str:
    path = tmp / "src" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


def _cli(*argv: str) -> None:
    assert main(list(argv)) == 0, argv


def _sql(dt_: object, where: str) -> int:
    return pa.table(deltalake.QueryBuilder().register("t", dt_).execute(f"select * from t where {where}")).num_rows


def _lit(v: str) -> str:
    return "'" + v.replace("'", "''") + "'"


def _rows(t: pa.Table, names: list[str]) -> list[tuple]:
    return sorted((tuple(repr(r[c]) for c in names) for r in t.select(names).to_pylist()))


def _string_table(tmp: Path) -> str:
    """A mirrored table partitioned by a string field holding every kind of value, with a float,
    a boolean, a long string, a timestamp and a column added later (missing from old files)."""
    uri = str(tmp / "t")
    b1 = [{"id": f"k {i:02d}/é", "country": COUNTRIES[i % len(COUNTRIES)], "ts": 1, "amount": i + 0.25,
           "flag": i % 3 == 0, "long": "y" * 100 + str(i % 4),
           "at": dt.datetime(2024, 3, 30, 23, i % 60, 1, 123456, tzinfo=dt.timezone.utc)} for i in range(33)]
    _cli("upsert", uri, _write(tmp, "b1", b1), *ARGS, "--partition-field", "country", "--mirror", "delta")
    _cli("alter", uri, "--add-column", "note:string")
    b2 = [dict(b1[i], ts=2, amount=-float(i), note=f"n{i}") for i in range(0, 33, 4)]
    _cli("upsert", uri, _write(tmp, "b2", b2), *ARGS)
    return uri


def test_string_partition_values_read_back_exactly(tmp_path):
    uri = _string_table(tmp_path)
    want = read_arrow(uri)
    names = [c for c in want.column_names if not c.startswith("_bi_")]
    table = Table.load(uri)
    dt_ = deltalake.DeltaTable(uri)
    assert dt_.version() == table.timeline.last_seq
    got = dt_.to_pyarrow_table()
    assert got.column_names == names
    assert _rows(got, names) == _rows(want, names)
    counts = Counter(want.column("country").to_pylist())
    assert counts[""] and counts[None], "the table holds both"
    ds = dt_.to_pyarrow_dataset()
    for value in COUNTRIES:
        n = counts[value]
        if value is None:
            assert ds.to_table(filter=pc.field("country").is_null()).num_rows == n
            assert _sql(dt_, "country is null") == n
            continue
        assert dt_.to_pyarrow_table(filters=[("country", "=", value)]).num_rows == n, repr(value)
        assert ds.to_table(filter=pc.field("country") == value).num_rows == n, repr(value)
        assert _sql(dt_, f"country = {_lit(value)}") == n, repr(value)
    assert dt_.to_pyarrow_table(filters=[("country", "in", ["", "="])]).num_rows == counts[""] + counts["="]
    # filters on the other columns: each as pyarrow filters the table's own rows
    for expr in (pc.field("amount") > 3.0, pc.field("flag") == True, pc.field("long") == "y" * 100 + "1",  # noqa: E712
                 pc.field("note").is_null(), pc.field("note") == "n4", pc.field("ts") == 2,
                 pc.field("at") > pa.scalar(dt.datetime(2024, 3, 30, 23, 10, tzinfo=dt.timezone.utc))):
        assert ds.to_table(filter=expr).num_rows == want.filter(expr).num_rows, str(expr)
    # the published form: a data column with exact statistics, so readers still skip files
    lines = [json.loads(x) for v in delta.versions_present(table)
             for x in table.io.read_bytes(delta.version_file(table, v)).decode().splitlines()]
    assert all(a["metaData"]["partitionColumns"] == [] for a in lines if "metaData" in a)
    adds = [a["add"] for a in lines if "add" in a]
    assert all(a["partitionValues"] == {} for a in adds)
    stats = [json.loads(a["stats"]) for a in adds]
    # a float or a timestamp has no exact statistics (NaN, millisecond truncation): deltalake
    # then must get no min/max map at all, or it reads a missing column as `>= null` and its
    # filters drop the file (the filters above)
    assert stats and all("minValues" not in s for s in stats)


def test_a_string_partition_still_prunes_files(tmp_path):
    """With exact statistics on every column, readers skip files on the partition field as
    they did on a partition column: the value's exact min/max, whatever its length."""
    uri = str(tmp_path / "t")
    rows = [{"id": f"k{i}", "country": COUNTRIES[i % len(COUNTRIES)], "ts": i} for i in range(44)]
    _cli("upsert", uri, _write(tmp_path, "b1", rows), *ARGS, "--partition-field", "country", "--mirror", "delta")
    dt_ = deltalake.DeltaTable(uri)
    assert len(dt_.file_uris()) == len(COUNTRIES)
    for value in COUNTRIES:
        predicate = "country is null" if value is None else f"country = {_lit(value)}"
        pruned = dt_.to_pyarrow_dataset(file_pruning_predicate=predicate)
        assert len(list(pruned.get_fragments())) == 1, repr(value)
        assert pruned.to_table().column("country").to_pylist() == [value] * 4, repr(value)


@pytest.mark.parametrize("typ,values", [
    (pa.int64(), [None, 0, -5, 2**40]),
    (pa.date32(), [None, dt.date(1970, 1, 1), dt.date(2024, 2, 29)]),
    (pa.bool_(), [None, True, False]),
    (pa.timestamp("us", tz="UTC"), [None, dt.datetime(2024, 3, 31, 1, 30, 0, 5, tzinfo=dt.timezone.utc)]),
    (pa.decimal128(10, 2), [None, Decimal("0.00"), Decimal("-12.50")]),  # deltalake reads "-12.50" as "-12.-50"
    (pa.timestamp("us"), [None, dt.datetime(1969, 12, 31, 23, 59, 59, 999999)]),
])
def test_other_partition_types_read_back_exactly(tmp_path, typ, values):
    """Every partition field is a data column, whatever its type: Polars' scan_delta parses a
    partition column's value out of the directory name (``__NULL__``, form-encoded text), and
    ``deltalake`` misreads a decimal's text (tests/unit/test_projection_exact_values.py)."""
    uri = str(tmp_path / "t")
    schema = pa.schema([("id", pa.string()), ("p", typ), ("ts", pa.int64())])
    rows = [{"id": f"k{i}", "p": values[i % len(values)], "ts": 1} for i in range(4 * len(values))]
    _cli("upsert", uri, _write(tmp_path, "b1", rows, schema), *ARGS, "--partition-field", "p", "--mirror", "delta")
    table = Table.load(uri)
    meta = json.loads(table.io.read_bytes(delta.version_file(table, 0)).decode().splitlines()[1])["metaData"]
    assert meta["partitionColumns"] == []
    dt_ = deltalake.DeltaTable(uri)
    want = read_arrow(uri)
    got = dt_.to_pyarrow_table()
    assert _rows(got, ["id", "p", "ts"]) == _rows(want, ["id", "p", "ts"])
    ds = dt_.to_pyarrow_dataset()
    for v in values:
        expr = pc.field("p").is_null() if v is None else pc.field("p") == pa.scalar(v, typ)
        assert ds.to_table(filter=expr).num_rows == want.filter(expr).num_rows == 4, repr(v)
    # the file's one value is its exact min and max where Delta keeps exact statistics for the
    # type (not timestamps, truncated to milliseconds, nor decimals), and null is a null count:
    # readers still skip files (deltalake 1.6 skips on integers and dates; not on booleans,
    # whose statistics it reads but does not prune with)
    preds = ["p is null"]
    if pa.types.is_integer(typ):
        preds += [f"p = {v}" for v in values if v is not None]
    elif pa.types.is_date32(typ):
        preds += [f"p = '{v.isoformat()}'::date" for v in values if v is not None]
    for pred in preds:
        assert len(list(dt_.to_pyarrow_dataset(file_pruning_predicate=pred).get_fragments())) == 1, pred


# -- item 4: mirror --repair checks every version ---------------------------------------------

def _digests(root: str) -> dict[str, str]:
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


def _mirrored_history(tmp: Path, n: int) -> tuple[str, list[dict]]:
    """A mirrored table after ``n`` upserts (a checkpoint at version 10), the rows of the last
    state by key (the oracle: each upsert moves some keys between "" and null)."""
    uri = str(tmp / "t")
    state: dict[str, dict] = {}
    for b in range(n):
        rows = [{"id": f"k {i:02d}", "country": COUNTRIES[(i + b) % len(COUNTRIES)], "ts": b, "v": f"{b}/{i}"}
                for i in range(b % 3, 14, 2)]
        extra = ["--partition-field", "country", "--mirror", "delta"] if b == 0 else []
        _cli("upsert", uri, _write(tmp, f"b{b}", rows), *ARGS, "--index", "bucket", "--num-buckets", "2",
             "--batch-id", f"b{b}", *extra)
        state.update({(r["id"], r["country"]): r for r in rows})  # bucket index: identity = key + partition
    return uri, list(state.values())


def _write_old_form(log_dir: Path, field: str, partition_values: Callable[[dict], dict]) -> None:
    """Rewrite every JSON version of ``log_dir`` as an older release wrote it: ``field`` declared
    in ``metaData.partitionColumns`` and each ``add`` given ``partition_values(add)`` (which may
    edit the ``add`` too)."""
    for f in sorted(log_dir.glob("*.json")):
        out = []
        for line in f.read_text().splitlines():
            a = json.loads(line)
            if "metaData" in a:
                a["metaData"]["partitionColumns"] = [field]
            if "add" in a:
                a["add"]["partitionValues"] = partition_values(a["add"])
            out.append(json.dumps(a, sort_keys=True, separators=(",", ":")) + "\n")
        f.write_text("".join(out))


def _delta_rows(uri: str) -> list[tuple]:
    return _rows(deltalake.DeltaTable(uri).to_pyarrow_table(), ["id", "country", "ts", "v"])


@pytest.mark.parametrize("damage", ["empty", "garbage", "other version", "dropped add"])
def test_repair_finds_and_rewrites_a_damaged_version(tmp_path, capsys, damage):
    uri, want_rows = _mirrored_history(tmp_path, 14)
    want = _rows(pa.Table.from_pylist(want_rows), ["id", "country", "ts", "v"])
    assert _delta_rows(uri) == want
    log_dir = Path(uri, "_delta_log")
    good = _digests(str(log_dir))
    v12 = log_dir / f"{12:020d}.json"
    if damage == "empty":
        v12.write_bytes(b"")
    elif damage == "garbage":
        v12.write_bytes(b'{"add": {"path": oops\n')
    elif damage == "other version":
        v12.write_bytes((log_dir / f"{11:020d}.json").read_bytes())
    else:
        v12.write_text("".join(line + "\n" for line in v12.read_text().splitlines() if '"add"' not in line))
    # an upsert after the damage still exits 0 (the hook never fails a commit) ...
    _cli("upsert", uri, _write(tmp_path, "late", [{"id": "k late", "country": "", "ts": 99, "v": "late"}]), *ARGS)
    want_rows.append({"id": "k late", "country": "", "ts": 99, "v": "late"})
    want = _rows(pa.Table.from_pylist(want_rows), ["id", "country", "ts", "v"])
    capsys.readouterr()
    assert main(["mirror", uri, "--repair"]) == 0
    assert _delta_rows(uri) == want
    out = capsys.readouterr().out.splitlines()
    report = json.loads(out[0])
    assert report["rewritten"] == [12] and report["written"] == [] and report["version"] == 15
    assert "1 damaged or outdated version rewritten" in out[1], out[1]
    after = _digests(str(log_dir))
    assert after[f"{12:020d}.json"] == good[f"{12:020d}.json"], "the bytes the timeline projects"
    assert all(after[k] == v for k, v in good.items() if k.endswith(".json")), "the sound versions are untouched"
    # the checkpoint at 10 was built before the damage: kept as it was
    assert after[f"{10:020d}.checkpoint.parquet"] == good[f"{10:020d}.checkpoint.parquet"]
    capsys.readouterr()
    assert main(["mirror", uri, "--repair"]) == 0  # idempotent: nothing to do, the log untouched
    assert json.loads(capsys.readouterr().out.splitlines()[0]) == {"version": 15, "written": [], "rewritten": [],
                                                                   "checkpoints": []}
    assert _digests(str(log_dir)) == after


def test_repair_rewrites_a_checkpoint_built_from_a_damaged_log(tmp_path, capsys):
    """Version 3 damaged before version 10's checkpoint was written: the checkpoint carries
    the damage (deltalake built it from the log as it was), so repair writes it again."""
    uri, want_rows = _mirrored_history(tmp_path, 3)
    log_dir = Path(uri, "_delta_log")
    v3 = log_dir / f"{3:020d}.json"
    v3.write_text("".join(line + "\n" for line in v3.read_text().splitlines() if '"remove"' not in line))
    for b in range(3, 12):
        rows = [{"id": f"k {i:02d}", "country": COUNTRIES[(i + b) % len(COUNTRIES)], "ts": b, "v": f"{b}/{i}"}
                for i in range(b % 3, 14, 2)]
        _cli("upsert", uri, _write(tmp_path, f"b{b}", rows), *ARGS, "--batch-id", f"b{b}")
        want_rows = [r for r in want_rows if (r["id"], r["country"]) not in {(x["id"], x["country"]) for x in rows}]
        want_rows += rows
    assert (log_dir / f"{10:020d}.checkpoint.parquet").exists()
    want = _rows(pa.Table.from_pylist(want_rows), ["id", "country", "ts", "v"])
    assert _delta_rows(uri) != want, "the damage reaches readers through the checkpoint"
    capsys.readouterr()
    assert main(["mirror", uri, "--repair"]) == 0
    assert _delta_rows(uri) == want
    report = json.loads(capsys.readouterr().out.splitlines()[0])
    assert report["rewritten"] == [3] and report["checkpoints"] == [10]
    assert json.loads((log_dir / "_last_checkpoint").read_text())["version"] == 10
    for v in range(12):
        assert _rows(deltalake.DeltaTable(uri, version=v).to_pyarrow_table(), ["id", "country", "ts", "v"]) == \
            _rows(read_arrow(uri, as_of=Table.load(uri).timeline.entry(v)["instant"]) if v else
                  pa.table({c: pa.array([], pa.string()) for c in ["id", "country", "ts", "v"]}),
                  ["id", "country", "ts", "v"]), v


def test_repair_migrates_a_log_written_with_the_old_partition_form(tmp_path, capsys):
    """A projection written before issue 36 declares the string partition field in
    partitionColumns (version 0's metaData, every add's partitionValues) and reads "" as null;
    repair rewrites the whole log, and the checkpoint, in the new form."""
    uri, want_rows = _mirrored_history(tmp_path, 12)
    log_dir = Path(uri, "_delta_log")

    def from_stats(add: dict) -> dict:  # the old form, as 3fbacf9 wrote it: the value out of the stats
        st = json.loads(add["stats"])
        value = st.get("minValues", {}).get("country")
        for k in ("minValues", "maxValues", "nullCount"):
            st.get(k, {}).pop("country", None)
        add["stats"] = json.dumps(st, sort_keys=True, separators=(",", ":"))
        return {"country": value}

    _write_old_form(log_dir, "country", from_stats)
    (log_dir / f"{10:020d}.checkpoint.parquet").unlink()
    (log_dir / "_last_checkpoint").unlink()
    deltalake.DeltaTable(uri, version=10).create_checkpoint()  # the checkpoint of the old form
    want = _rows(pa.Table.from_pylist(want_rows), ["id", "country", "ts", "v"])
    assert _delta_rows(uri) != want, "the old form reads '' as null"
    capsys.readouterr()
    assert main(["mirror", uri, "--repair"]) == 0
    assert _delta_rows(uri) == want
    report = json.loads(capsys.readouterr().out.splitlines()[0])
    assert report["rewritten"][0] == 0 and report["written"] == [] and report["checkpoints"] == [10]
    got = deltalake.DeltaTable(uri).to_pyarrow_table(filters=[("country", "=", "")])
    assert got.num_rows == sum(r["country"] == "" for r in want_rows) > 0


def test_repair_names_a_version_it_cannot_place(tmp_path, capsys):
    """A version past the last sequence entry was not written from the timeline: one line,
    exit 1, the file left for a person (the versions before it are repaired)."""
    uri, _ = _mirrored_history(tmp_path, 3)
    log_dir = Path(uri, "_delta_log")
    (log_dir / f"{2:020d}.json").write_bytes(b"")
    (log_dir / f"{9:020d}.json").write_bytes((log_dir / f"{1:020d}.json").read_bytes())
    capsys.readouterr()
    assert main(["mirror", uri, "--repair"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "version 9" in err[0] and f"{9:020d}.json" in err[0], err
    assert (log_dir / f"{9:020d}.json").exists()
    assert (log_dir / f"{2:020d}.json").stat().st_size > 0, "the damaged version before it is repaired"


def test_repair_after_clean_leaves_sound_old_versions(tmp_path, capsys):
    """Versions older than clean's window list deleted files, whose footers (stats) cannot be
    read again: repair leaves a sound one as written and still rewrites a damaged one."""
    uri, _ = _mirrored_history(tmp_path, 4)
    _cli("clean", uri, "--retain-commits", "1")
    table = Table.load(uri)
    earliest = table.retained_from()["earliest_retained_seq"]
    assert earliest > 2
    log_dir = Path(uri, "_delta_log")
    before = _digests(str(log_dir))
    capsys.readouterr()
    assert main(["mirror", uri, "--repair"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["rewritten"] == []
    assert _digests(str(log_dir)) == before
    (log_dir / f"{2:020d}.json").write_bytes(b"")
    assert main(["mirror", uri, "--repair"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["rewritten"] == [2]
    assert [json.loads(x) for x in (log_dir / f"{2:020d}.json").read_text().splitlines()][-1]["commitInfo"][
        "bucketindex"]["seq"] == 2
    assert deltalake.DeltaTable(uri).version() == table.timeline.last_seq


@pytest.mark.parametrize("typ,values", [(pa.string(), [None, "", "a/b"]), (pa.int64(), [None, 1, -2]),
                                        (pa.timestamp("us", tz="UTC"), [None, dt.datetime(2024, 1, 1, 0, 0, 0, 7,
                                                                                          tzinfo=dt.timezone.utc)])])
def test_a_writer_migrates_a_log_an_older_release_wrote(tmp_path, caplog, typ, values):
    """An older release declared the partition field in ``partitionColumns`` (a string before
    issue 36, other types before issue 39). Appending ``add`` actions without
    ``partitionValues`` to that log would read every such file's value as null (measured), so
    the next commit's hook rewrites the whole log in the current form first, without a repair."""
    uri = str(tmp_path / "t")
    schema = pa.schema([("id", pa.string()), ("p", typ), ("ts", pa.int64())])
    rows = [{"id": f"k{i}", "p": values[i % len(values)], "ts": 1} for i in range(3 * len(values))]
    _cli("upsert", uri, _write(tmp_path, "b1", rows, schema), *ARGS, "--partition-field", "p", "--mirror", "delta")
    log_dir = Path(uri, "_delta_log")

    def from_file(add: dict) -> dict:  # the old form: a partition column, its values as text
        v = pq.read_table(Path(uri, unquote(add["path"]))).column("p")[0].as_py()
        return {"p": None if v is None else delta.partition_string(v, typ)}

    _write_old_form(log_dir, "p", from_file)
    delta._CURRENT_FORM.clear()
    assert _rows(deltalake.DeltaTable(uri).to_pyarrow_table(), ["id", "p", "ts"]) == \
        _rows(read_arrow(uri), ["id", "p", "ts"]) or typ == pa.string(), "the old form reads back (but '')"
    b2 = [{"id": "k0", "p": values[1], "ts": 2}, {"id": "new", "p": values[-1], "ts": 2}]
    _cli("upsert", uri, _write(tmp_path, "b2", b2, schema), *ARGS)
    got = deltalake.DeltaTable(uri).to_pyarrow_table()
    assert got.column("p").null_count == sum(r["p"] is None for r in read_arrow(uri).to_pylist())
    assert _rows(got, ["id", "p", "ts"]) == _rows(read_arrow(uri), ["id", "p", "ts"])
    assert "form of an older release" in caplog.text
    table = Table.load(uri)
    for v in delta.versions_present(table):
        lines = [json.loads(x) for x in table.io.read_bytes(delta.version_file(table, v)).decode().splitlines()]
        assert all(a["metaData"]["partitionColumns"] == [] for a in lines if "metaData" in a), v
        assert all(a["add"]["partitionValues"] == {} for a in lines if "add" in a), v
