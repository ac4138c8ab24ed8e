"""Schema evolution on the in-process Arrow engine (format.md "Schema evolution").

A history on both table types -- create; add a column from a batch (``--schema-evolution
add-columns``); add another with ``bucketindex alter``; widen int -> bigint, float -> double and
date -> timestamp_ntz from a batch (``widen``) and a decimal's precision with ``alter``; upserts and
deletes after -- then ``read_arrow(uri, as_of=instant)`` for every instant equals the oracle at
that instant, in the schema of its time (older snapshots lack later columns and keep narrower
types). Compaction and clean across the change, validate after each step. Refused batches and
alters exit 2 with one line and leave the table byte-identical. An upsert prepared before a
concurrent alter commits after it without putting the old schema back.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.compact import run_compact
from spark_jobs.arrow_engine.upsert import ArrowUpsertEngine, run_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.cli import main
from spark_jobs.engines import precheck_upsert
from spark_jobs.exceptions import BadInputError
from spark_jobs.table.action import upsert as action
from spark_jobs.table.action.alter import run_alter
from spark_jobs.table.action.checkpoint import archive
from spark_jobs.table.action.clean import run_clean
from spark_jobs.table.action.compact import CompactionPolicy
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.schema import conform, evolve, parse_schema_evolution, widens
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches
from tests.spark.conftest import tree_digest

pytestmark = pytest.mark.unit

TOKYO = dt.timezone(dt.timedelta(hours=9))
#: keys and partition values as users have them: spaces, '/', '%', '+', non-ASCII
KEYS = ["a b", "c/d", "e%f", "g+h", "ключ", "鍵 1", "plain", "x/%+y"]
REGIONS = ["eu west/1", "us %2F+east", "亚太 ap"]

BASE = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.timestamp("us", tz="Asia/Tokyo")),
                  ("qty", pa.int32()), ("price", pa.float32()), ("amount", pa.decimal128(10, 2)),
                  ("day", pa.date32()), ("is_deleted", pa.bool_())])


def _ts(i: int) -> dt.datetime:
    return dt.datetime(2026, 1, 1, 9, 0, tzinfo=TOKYO) + dt.timedelta(minutes=i)


def _row(k: int, i: int, *, region: int | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": KEYS[k], "region": REGIONS[(k if region is None else region) % 3], "ts": _ts(i), "qty": 10 * k + i,
            "price": 0.5 * k + 0.25, "amount": Decimal(f"{k}.{i:02d}"), "day": dt.date(2026, 1, 1 + k),
            "is_deleted": False, **extra}


def _batches() -> list[tuple[pa.Schema, list[dict[str, Any]], dict[str, Any]]]:
    """(schema, rows, upsert options) of each batch of the history; alters are ``None`` rows."""
    with_note = pa.schema([*BASE, ("note", pa.string())])
    wide = pa.schema([f if f.name not in ("qty", "price", "day") else
                      f.with_type({"qty": pa.int64(), "price": pa.float64(), "day": pa.timestamp("us")}[f.name])
                      for f in with_note] + [("score", pa.int64())])
    return [
        (BASE, [_row(k, 1) for k in range(6)], {}),
        (with_note, [_row(k, 2, note=f"n {k}/%+é") for k in (1, 4, 6)], {"schema_evolution": "add-columns"}),
        (wide, [_row(k, 3, note=None, score=k * 7, qty=2**40 + k, price=1.0 / 3,
                     day=dt.datetime(2026, 2, 1, 12, 30)) for k in (0, 2, 7)], {"schema_evolution": "widen"}),
        (wide, [_row(k, 4, note="late", score=None, qty=k, day=dt.datetime(2026, 3, 1), is_deleted=k == 3)
                for k in (3, 5)] + [_row(2, 0, note="stale", score=1, qty=1, day=dt.datetime(2026, 1, 1))],
         {}),
    ]


#: the history's steps: a batch number, or an alter
STEPS: list[Any] = [0, 1, ("alter", ["--add-column", "score:bigint"]), 2,
                    ("alter", ["--widen-column", "amount:decimal(14,2)"]), 3]


def _write(tmp_path: Path, name: str, schema: pa.Schema, rows: list[dict[str, Any]]) -> str:
    path = tmp_path / "batches" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


def _upsert(uri: str, source: str, batch_id: str, table_type: str, index: str, **kw: Any) -> dict[str, Any]:
    return run_upsert(UpsertOptions(table=uri, source=source, record_key=["id"], precombine_field="ts",
                                    partition_field="region", delete_field="is_deleted", batch_id=batch_id,
                                    index=index, table_type=table_type, num_buckets=2,
                                    # merge-on-read: logs of every schema stay for the test's own compaction
                                    **({"auto_compact": "off"} if table_type == "merge_on_read" else {}), **kw))


def _in_type(v: Any, t: pa.DataType) -> Any:
    """A batch value as a column of type ``t`` holds it (widened, as a reader widens an old file)."""
    if v is None:
        return None
    if pa.types.is_timestamp(t) and isinstance(v, dt.date) and not isinstance(v, dt.datetime):
        return dt.datetime.combine(v, dt.time())
    if pa.types.is_timestamp(t) and t.tz is not None:
        return v.astimezone(dt.timezone.utc)
    if pa.types.is_floating(t):
        return float(pa.scalar(v, pa.float32()).as_py()) if isinstance(v, float) and t == pa.float32() else v
    return v


def _expected(rows: dict[Any, dict[str, Any]], schema: pa.Schema, float_from: dict[Any, pa.DataType]
              ) -> dict[Any, dict[str, Any]]:
    out = {}
    for k, r in rows.items():
        row = {}
        for f in schema:
            v = r.get(f.name)
            if f.name == "price" and v is not None and float_from[k] == pa.float32():
                v = float(pa.scalar(v, pa.float32()).as_py())  # stored as float, widened exactly
            row[f.name] = _in_type(v, f.type)
        out[k] = row
    return out


def _check_snapshot(uri: str, instant: str, want_schema: pa.Schema, expected: dict[Any, dict[str, Any]]) -> None:
    got = read_arrow(uri, as_of=instant)
    assert got.schema.equals(want_schema), (instant, got.schema, want_schema)
    rows = {r["id"]: r for r in got.to_pylist()}
    assert len(rows) == got.num_rows, "a key appears twice"
    assert rows == expected, instant


@pytest.mark.parametrize("table_type,index", [("copy_on_write", "record"), ("merge_on_read", "bucket")])
def test_history_reads_every_instant_in_its_schema(tmp_path, table_type, index, capsys):
    uri = str(tmp_path / "t")
    batches = _batches()
    applied: list[list[dict[str, Any]]] = []
    float_from: dict[Any, pa.DataType] = {}
    snapshots: list[tuple[str, pa.Schema, dict[Any, dict[str, Any]]]] = []
    schema = pa.schema([f for f in BASE if f.name != "is_deleted"])
    for step in STEPS:
        if isinstance(step, tuple):
            assert main(["alter", uri, *step[1]]) == 0
            out = capsys.readouterr().out
            assert "altered the schema at instant" in out
            name, _, typ = step[1][1].partition(":")
            t = {"score:bigint": pa.int64(), "amount:decimal(14,2)": pa.decimal128(14, 2)}[step[1][1]]
            schema = schema.append(pa.field(name, t)) if step[1][0] == "--add-column" else schema.set(
                schema.get_field_index(name), pa.field(name, t))
            instant = Table.load(uri).timeline.completed()[-1].timestamp
        else:
            bschema, rows, kw = batches[step]
            res = _upsert(uri, _write(tmp_path, f"b{step}", bschema, rows), f"b{step}", table_type, index, **kw)
            instant = res["instant"]
            applied.append(rows)
            for r in rows:
                float_from.setdefault(r["id"], bschema.field("price").type)
                if bschema.field("price").type == pa.float64():
                    float_from[r["id"]] = pa.float64()
            for f in bschema:
                if f.name == "is_deleted":
                    continue
                if f.name not in schema.names:
                    schema = schema.append(pa.field(f.name, f.type))
                elif kw.get("schema_evolution") == "widen" and widens(schema.field(f.name).type, f.type):
                    schema = schema.set(schema.get_field_index(f.name), pa.field(f.name, f.type))
        state = reduce_batches(applied, key="id", precombine="ts", delete_field="is_deleted")
        want = pa.schema([pa.field(f.name, pa.timestamp("us", tz="UTC") if f.name == "ts" else f.type)
                          for f in schema])
        snapshots.append((instant, want, _expected(state, want, float_from)))
        assert run_validate(uri)["ok"], step
    # the evolved schema: columns appended, types widened, nothing dropped
    assert [(f.name, str(f.type)) for f in snapshots[-1][1]] == [
        ("id", "string"), ("region", "string"), ("ts", "timestamp[us, tz=UTC]"), ("qty", "int64"),
        ("price", "double"), ("amount", "decimal128(14, 2)"), ("day", "timestamp[us]"), ("note", "string"),
        ("score", "int64")]
    # an old value read widened: key 1's qty (int), price (float) and day (date) came from batch 1
    latest = {r["id"]: r for r in read_arrow(uri).to_pylist()}
    assert latest[KEYS[1]]["day"] == dt.datetime(2026, 1, 2) and latest[KEYS[1]]["score"] is None
    assert latest[KEYS[0]]["qty"] == 2**40 and latest[KEYS[2]]["note"] is None  # the stale row lost
    for instant, want, expected in snapshots:
        _check_snapshot(uri, instant, want, expected)
    # only commits that change the schema record one: creation, batch 1, the alters, batch 2
    table = Table.load(uri)
    recorded = [bool(table.timeline.read_commit(i).schema) for i in table.timeline.completed(["commit"])]
    assert recorded == [True, True, True, True, True, False]

    # compaction (data and index) across the change: files of every schema fold into the current one
    res = run_compact(uri, policy=CompactionPolicy(min_logs=1, min_deltas=1))
    assert res.get("instant"), res
    table = Table.load(uri)
    for s in table.view().slices():
        if s.instant == res["instant"]:
            assert pq.read_schema(table.io.open_input_file(table.abs(s.path))).names[:9] == snapshots[-1][1].names
    _check_snapshot(uri, res["instant"], snapshots[-1][1], snapshots[-1][2])
    assert run_validate(uri)["ok"]
    # clean keeps the last snapshot (the compaction's): files of the older schemas go, it reads as before
    cleaned = run_clean(uri, retain_commits=1)
    assert cleaned["files"] > 0
    _check_snapshot(uri, res["instant"], snapshots[-1][1], snapshots[-1][2])
    with pytest.raises(Exception, match="retained window"):
        read_arrow(uri, as_of=snapshots[0][0])
    assert run_validate(uri)["ok"]
    # an upsert after all of it, in the evolved schema
    last = [_row(k, 9, note="after", score=k, qty=k, day=dt.datetime(2026, 4, 1)) for k in (1, 6)]
    _upsert(uri, _write(tmp_path, "after", batches[-1][0], last), "after", table_type, index)
    applied.append(last)
    state = reduce_batches(applied, key="id", precombine="ts", delete_field="is_deleted")
    float_from.update({r["id"]: pa.float64() for r in last})
    _check_snapshot(uri, Table.load(uri).timeline.completed()[-1].timestamp, snapshots[-1][1],
                    _expected(state, snapshots[-1][1], float_from))
    assert run_validate(uri)["ok"]


def test_refused_batches_and_alters_exit_2_and_write_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("spark_jobs.cli._spark", lambda *a: pytest.fail("a refusal started a Spark session"))
    uri = str(tmp_path / "t")
    _upsert(uri, _write(tmp_path, "b0", BASE, [_row(k, 1) for k in range(4)]), "b0", "merge_on_read", "record")
    before = tree_digest(tmp_path / "t")

    def refused(name: str, schema: pa.Schema, rows: list[dict[str, Any]], opts: list[str], words: str) -> None:
        src = _write(tmp_path, name, schema, rows)
        if name not in ("overflow", "mode"):  # told from the footers alone, before any engine (or JVM) starts
            with pytest.raises(BadInputError, match=re.escape(words)):
                precheck_upsert(UpsertOptions(table=uri, source=src, delete_field="is_deleted",
                                              schema_evolution=opts[1] if opts else None))
        code = main(["upsert", uri, src, "--engine", "arrow", "--delete-field", "is_deleted", *opts])
        err = capsys.readouterr().err.strip()
        assert code == 2, (name, err)
        assert len(err.splitlines()) == 1 and words in err, (name, err)
        assert tree_digest(tmp_path / "t") == before, name

    plain = [_row(1, 5)]
    # a column the table lacks, without the option: the message names both ways to add it
    refused("extra", pa.schema([*BASE, ("note", pa.string())]), [_row(1, 5, note="x")], [],
            "--schema-evolution add-columns")
    # narrowing: bigint values into the table's int, without widen: the cast refuses the overflow
    refused("overflow", BASE.set(3, pa.field("qty", pa.int64())), [_row(1, 5, qty=2**40)], [],
            "cannot be cast to the table's int")
    # a change of kind under widen: int to double, decimal scale, a zone
    refused("kind", BASE.set(3, pa.field("qty", pa.float64())), [_row(1, 5, qty=1.5)],
            ["--schema-evolution", "all"], "a change of kind (integer to floating point)")
    refused("scale", BASE.set(5, pa.field("amount", pa.decimal128(12, 4))), plain, ["--schema-evolution", "widen"],
            "scale is fixed")
    refused("zone", BASE.set(6, pa.field("day", pa.timestamp("us", tz="UTC"))),
            [_row(1, 5, day=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))], ["--schema-evolution", "widen"],
            "timestamp_ntz only")
    refused("mode", BASE, plain, ["--schema-evolution", "everything"], "--schema-evolution takes")

    assert main(["alter", uri, "--add-column", "score:bigint"]) == 0
    capsys.readouterr()
    before = tree_digest(tmp_path / "t")

    def alter_refused(args: list[str], words: str) -> None:
        code = main(["alter", uri, *args])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and words in err, (args, err)
        assert tree_digest(tmp_path / "t") == before, args

    alter_refused(["--widen-column", "score:int"], "narrowing")
    alter_refused(["--widen-column", "qty:double"], "a change of kind")
    alter_refused(["--widen-column", "id:bigint"], "cannot become bigint")
    alter_refused(["--widen-column", "day:timestamp"], "timestamp_ntz only")
    alter_refused(["--add-column", "score:int"], "already has column 'score' as bigint")
    alter_refused(["--add-column", "x:varchar2"], "unknown type 'varchar2'")
    alter_refused(["--add-column", "a.b:int"], "holds '.'")
    alter_refused(["--add-column", "nocolon"], "takes NAME:TYPE")
    alter_refused(["--add-column", "n:int", "--widen-column", "n:bigint"], "named twice")
    alter_refused([], "at least one --add-column")
    # the same alter again is a no-op: exit 0, nothing written
    assert main(["alter", uri, "--add-column", "score:bigint"]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert tree_digest(tmp_path / "t") == before
    assert main(["alter", str(tmp_path / "none"), "--add-column", "x:int"]) == 2
    assert "no table at" in capsys.readouterr().err


class _AlterDuringPrepare(ArrowUpsertEngine):
    """The real Arrow engine; between its validation and its commit another process alters the
    table (run here, so the interleaving is certain)."""

    def __init__(self, uri: str, alter: list[str], then: Any = None) -> None:
        super().__init__()  # the engine's own state (its memory budget: none, as the CLI without one)
        self.uri, self.alter, self.then, self.prepared = uri, alter, then, 0

    def prepare(self, *a: Any, **kw: Any) -> Any:
        batch = super().prepare(*a, **kw)
        self.prepared += 1
        if self.prepared == 1:
            run_alter(self.uri, add_columns=self.alter)
            if self.then is not None:
                self.then()
        return batch


@pytest.mark.parametrize("evolving", [False, True, "conflicting"])
def test_an_upsert_prepared_before_an_alter_keeps_the_alters_column(tmp_path, evolving):
    uri = str(tmp_path / "t")
    _upsert(uri, _write(tmp_path, "b0", BASE, [_row(k, 1) for k in range(4)]), "b0", "copy_on_write", "record")
    then = None
    if evolving == "conflicting":
        # after the alter, another writer updates key 1's file group (with the new column): the
        # upsert conflicts, is validated again on the altered schema -- which it lacks a column
        # of -- and writes its rows with that column null, as if written before it existed
        def then() -> None:
            src = _write(tmp_path, "other", pa.schema([*BASE, ("score", pa.decimal128(10, 2))]),
                         [_row(1, 4, score=Decimal("9.50"))])
            _upsert(uri, src, "other", "copy_on_write", "record")

        evolving = False
        conflicting = True
    else:
        conflicting = False
    if evolving:  # the upsert adds a column too: it conflicts with the alter and is validated again
        schema, rows = pa.schema([*BASE, ("note", pa.string())]), [_row(1, 5, note="n/%+"), _row(6, 5, note=None)]
    else:  # it changes nothing of the schema: it commits beside the alter, recording none
        schema, rows = BASE, [_row(1, 5), _row(6, 5)]
    engine = _AlterDuringPrepare(uri, ["score:decimal(10,2)"], then)
    opts = UpsertOptions(table=uri, source=_write(tmp_path, "b1", schema, rows), record_key=["id"],
                         precombine_field="ts", partition_field="region", delete_field="is_deleted", batch_id="b1",
                         schema_evolution="add-columns" if evolving else None)
    res = action.run(engine, opts)
    retried = evolving or conflicting
    assert res["retries"] == (1 if retried else 0) and engine.prepared == (2 if retried else 1)
    table = Table.load(uri)
    assert table.view().schema.names[-3:] == (["score", "note", "_bi_key"] if evolving else ["day", "score", "_bi_key"])
    got = {r["id"]: r for r in read_arrow(uri).to_pylist()}
    assert all(r["score"] is None for r in got.values()) and got[KEYS[6]]["qty"] == 65
    if evolving:
        assert got[KEYS[1]]["note"] == "n/%+" and got[KEYS[0]]["note"] is None
    if conflicting:  # the later event won over the concurrent writer's, whose score it did not know
        assert got[KEYS[1]]["qty"] == 15
    meta = table.timeline.read_commit(table.timeline.completed()[-1])
    assert (meta.schema is not None) == evolving
    assert run_validate(uri)["ok"]


def test_the_schema_survives_archival(tmp_path):
    """After the commit that carried a schema is archived, every later snapshot still knows it
    (checkpoints hold the view's schema), and time travel before it still sees the older one."""
    uri = str(tmp_path / "t")
    _upsert(uri, _write(tmp_path, "b0", BASE, [_row(0, 1)]), "b0", "merge_on_read", "record")
    first = Table.load(uri).timeline.completed()[-1].timestamp
    run_alter(uri, add_columns=["score:bigint"])
    altered = Table.load(uri).timeline.completed()[-1].timestamp
    for i in range(21):  # two checkpoints (every 10 entries): the first ten entries can be archived
        k = i % len(KEYS)
        _upsert(uri, _write(tmp_path, f"s{i}", BASE.append(pa.field("score", pa.int64())),
                            [_row(k, 10 + i, score=None)]), f"s{i}", "merge_on_read", "record")
    table = Table.load(uri)
    archive(table, min_entries=1)
    table = Table.load(uri)
    assert any(a <= 2 <= b for a, b in table.timeline.archives(refresh=True)), "the alter's entry is archived"
    assert "score" in table.view().schema.names
    assert "score" in Table.load(uri).view(altered).schema.names
    assert "score" not in Table.load(uri).view(first).schema.names
    assert read_arrow(uri).column("score").null_count == read_arrow(uri).num_rows
    assert read_arrow(uri, as_of=first).column_names == [f.name for f in BASE if f.name != "is_deleted"]


def test_rules():
    """The engine-neutral rules on their own: what widens, what a batch evolves, how a file conforms."""
    for old, new in [(pa.int8(), pa.int16()), (pa.int16(), pa.int64()), (pa.float32(), pa.float64()),
                     (pa.decimal128(5, 2), pa.decimal128(38, 2)), (pa.date32(), pa.timestamp("us"))]:
        assert widens(old, new) and not widens(new, old)
    for old, new in [(pa.int64(), pa.int32()), (pa.int32(), pa.float64()), (pa.decimal128(5, 2), pa.decimal128(7, 3)),
                     (pa.date32(), pa.timestamp("us", tz="UTC")), (pa.string(), pa.binary()),
                     (pa.list_(pa.int32()), pa.list_(pa.int64()))]:
        assert not widens(old, new)
    assert parse_schema_evolution("add-columns, widen") == parse_schema_evolution("all") == {"add-columns", "widen"}
    assert parse_schema_evolution("none") == frozenset()
    with pytest.raises(BadInputError):
        parse_schema_evolution("add-column")
    table = pa.schema([("id", pa.int32()), ("v", pa.int32()), ("_bi_key", pa.string())])
    batch = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("w", pa.string()), ("del", pa.bool_())])
    out = evolve(table, batch, modes={"add-columns", "widen"}, delete_field="del", text_fixed={"id": "record key"})
    assert [(f.name, f.type) for f in out] == [("id", pa.int64()), ("v", pa.int64()), ("w", pa.string()),
                                               ("_bi_key", pa.string())]
    assert evolve(table, pa.schema([("id", pa.int64()), ("v", pa.int16())]), modes=set()) is table
    with pytest.raises(BadInputError, match="record key field"):
        evolve(pa.schema([("id", pa.float32())]), pa.schema([("id", pa.float64())]), modes={"widen"},
               text_fixed={"id": "record key"})
    old = pa.table({"v": pa.array([1], pa.int32()), "_bi_op": ["upsert"]}).replace_schema_metadata({"k": "v"})
    got = conform(old, out)
    assert got.column_names == ["id", "v", "w", "_bi_key", "_bi_op"] and got.schema.metadata == {b"k": b"v"}
    assert got.column("v").type == pa.int64() and got.column("w").null_count == 1


def test_the_airflow_operator_passes_schema_evolution_to_the_cli():
    """The operator's ``schema_evolution`` becomes the CLI's ``--schema-evolution`` (the argument
    list spark-submit runs), and the CLI parses it back; an in-task run gets it in its options."""
    from airflow_provider_bucketindex.demo import sandbox

    sandbox.isolate_before_import()
    from airflow_provider_bucketindex.hooks.bucketindex import upsert_args
    from airflow_provider_bucketindex.operators import UpsertWithIndexOperator
    from spark_jobs.cli import build_parser

    args = upsert_args("/lake/t", "/landing/b", batch_id="b1", engine="spark", schema_evolution="add-columns,widen")
    assert args[-2:] == ["--schema-evolution", "add-columns,widen"]
    parsed = build_parser().parse_args(["upsert", *args])
    assert parse_schema_evolution(parsed.schema_evolution) == {"add-columns", "widen"}
    assert "--schema-evolution" not in upsert_args("/lake/t", "/landing/b")
    op = UpsertWithIndexOperator(task_id="u", table_uri="/lake/t", source_uri="/landing/b", schema_evolution="all")
    assert op.schema_evolution == "all"
