"""The Python API (``spark_jobs.Table``) used as a delta-rs user uses ``DeltaTable``: create from a
``pyarrow.Table``, upsert pandas and Polars frames, delete keys, time travel, history, schema, a
dataset read by DuckDB -- every answer checked against the oracle (the batches reduced by key).
Arrow engine only (``auto`` picks it for batches this small): no JVM."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import spark_jobs
from spark_jobs import BadInputError, CompactOptions, HistoryEntry, Table, ValidateOptions, WriteResult
from spark_jobs.cli import main
from tests.oracle import reduce_batches
from tests.unit.test_cli_newcomer import tree_digest

ROOT = Path(__file__).resolve().parents[2]

#: keys and partition values as users' data has them
FIRST = [
    {"id": "a b", "region": "eu west", "ts": 1, "amount": 1.5},
    {"id": "x/y", "region": "a/b", "ts": 1, "amount": 2.5},
    {"id": "50%", "region": "50% off", "ts": 1, "amount": 3.5},
    {"id": "1+1", "region": "", "ts": 1, "amount": 4.5},
    {"id": "Zürich ☃", "region": "Ünïcode", "ts": 1, "amount": 5.5},
    {"id": "nul", "region": None, "ts": 1, "amount": 6.5},
]
PANDAS = [  # an update, a key moving partitions, a stale row, an insert
    {"id": "a b", "region": "eu west", "ts": 2, "amount": 10.0},
    {"id": "x/y", "region": "+plus", "ts": 3, "amount": 20.0},
    {"id": "50%", "region": "50% off", "ts": 0, "amount": 99.0},
    {"id": "neu é", "region": "", "ts": 1, "amount": 30.0},
]
POLARS = [
    {"id": "1+1", "region": "", "ts": 5, "amount": 40.0},
    {"id": "brand/new", "region": "a/b", "ts": 1, "amount": 50.0},
]
DELETED = ["Zürich ☃", "x/y", "never there"]
DELETE_TS = 4


def rows(t: pa.Table) -> dict:
    return {r["id"]: r for r in t.to_pylist()}


def oracle(*batches: list[dict]) -> dict:
    return reduce_batches(batches, key="id", precombine="ts", delete_field="is_deleted")


def test_a_delta_rs_user_session_matches_the_oracle(tmp_path):
    uri = str(tmp_path / "orders")
    first = pa.Table.from_pylist(FIRST, schema=pa.schema([("id", pa.string()), ("region", pa.string()),
                                                          ("ts", pa.int64()), ("amount", pa.float64())]))
    # copy-on-write: every stale row is counted in `ignored` (a merge-on-read write counts one only
    # where it reads the stored row: README, "Table types")
    t = Table.create(uri, first, record_key="id", partition_field="region", precombine_field="ts",
                     table_type="copy_on_write")
    assert rows(t.read()) == oracle(FIRST)

    r = t.upsert(pd.DataFrame(PANDAS))
    assert isinstance(r, WriteResult) and r.engine == "arrow" and not r.noop
    assert (r.inserted, r.updated, r.ignored.stale_upserts) == (1, 2, 1)
    after_pandas = r.instant
    r = t.upsert(pl.DataFrame(POLARS))
    assert (r.inserted, r.updated) == (1, 1)
    d = t.delete(DELETED, precombine=DELETE_TS)
    assert d.deleted == 2 and d.ignored.stale_or_absent_deletes == 1  # the absent key changed nothing

    deletes = [{"id": k, "ts": DELETE_TS, "is_deleted": True} for k in DELETED]
    expect = oracle(FIRST, PANDAS, POLARS, deletes)
    assert rows(t.read()) == expect
    assert t.validate().ok

    # time travel: the snapshot right after the pandas batch, by instant and by the typed history
    assert rows(t.read(as_of=after_pandas)) == oracle(FIRST, PANDAS)
    history = t.history()
    assert all(isinstance(e, HistoryEntry) for e in history)
    assert [e.sequence for e in history] == [4, 3, 2, 1]
    assert [e.action for e in history] == ["commit"] * 4
    assert history[0].counts["deleted"] == 2 and history[0].ignored.stale_or_absent_deletes == 1
    assert history[2].instant == after_pandas and history[2].engine == "arrow"
    assert history[-1].timestamp.tzinfo is not None and history[-1].schema_changes == ()
    assert rows(t.read(as_of=history[-1].instant)) == oracle(FIRST)
    assert rows(t.read(as_of=history[2].completed)) == oracle(FIRST, PANDAS)  # by time: a datetime
    assert history[2].timestamp <= history[2].completed < history[1].completed

    assert t.schema() == pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.int64()),
                                    ("amount", pa.float64())])

    # the dataset, queried by DuckDB (it scans the Arrow dataset lazily), gives the snapshot
    orders = t.to_pyarrow_dataset()
    got = duckdb.sql("SELECT id, region, ts, amount FROM orders").arrow()
    assert rows(got.read_all() if isinstance(got, pa.RecordBatchReader) else got) == expect
    old = t.to_pyarrow_dataset(as_of=after_pandas)
    n = duckdb.sql("SELECT count(*) FROM old").fetchall()[0][0]
    assert n == len(oracle(FIRST, PANDAS))


def test_a_record_batch_reader_and_a_path_are_sources_too(tmp_path):
    import pyarrow.parquet as pq

    uri = str(tmp_path / "t")
    schema = pa.schema([("id", pa.string()), ("v", pa.int64())])
    batches = [pa.record_batch([pa.array([f"k {i}", f"k/{i}"]), pa.array([i, i])], schema=schema) for i in range(3)]
    t = Table.create(uri, pa.RecordBatchReader.from_batches(schema, batches), record_key="id")
    src = tmp_path / "more.parquet"
    pq.write_table(pa.table({"id": ["k 0", "ü"], "v": [7, 8]}), src)
    r = t.upsert(str(src))
    assert (r.inserted, r.updated) == (1, 1)
    assert rows(t.read()) == reduce_batches([[r for b in batches for r in b.to_pylist()],
                                             [{"id": "k 0", "v": 7}, {"id": "ü", "v": 8}]],
                                            key="id", precombine=None, delete_field=None)


@pytest.mark.parametrize("frame", [pd.DataFrame, pl.DataFrame])
def test_a_frame_missing_the_record_key_is_one_line_and_leaves_the_table_byte_identical(tmp_path, frame):
    uri = tmp_path / "t"
    t = Table.create(str(uri), pa.table({"id": ["a"], "ts": [1], "v": [1.0]}), record_key="id",
                     precombine_field="ts")
    before = tree_digest(uri)
    with pytest.raises(BadInputError) as e:
        t.upsert(frame({"ts": [2], "v": [2.0]}))
    message = str(e.value)
    assert "\n" not in message and "id" in message
    assert "bucketindex-batch-" not in message  # the temporary file is not what the user gave
    assert tree_digest(uri) == before
    # and a second create of the same table is refused the same way
    with pytest.raises(BadInputError, match="already exists"):
        Table.create(str(uri), pa.table({"id": ["b"], "ts": [1], "v": [1.0]}), record_key="id")
    with pytest.raises(BadInputError, match="unknown option"):
        t.upsert(pa.table({"id": ["b"], "ts": [1], "v": [1.0]}), delete_feld="x")
    assert tree_digest(uri) == before


def test_pandas_nanosecond_timestamps_are_kept_to_the_microsecond_and_finer_ones_refused(tmp_path):
    uri = tmp_path / "t"
    when = pd.Timestamp("2026-11-25 09:24:00.123456")
    t = Table.create(str(uri), pd.DataFrame({"id": ["a"], "at": [when]}), record_key="id")
    assert t.read().column("at").to_pylist()[0] == when.to_pydatetime()
    before = tree_digest(uri)
    with pytest.raises(BadInputError, match="finer than a microsecond"):
        t.upsert(pd.DataFrame({"id": ["b"], "at": [pd.Timestamp("2026-11-25 09:24:00.123456789")]}))
    assert tree_digest(uri) == before


def test_the_other_verbs_return_typed_results(tmp_path):
    uri = str(tmp_path / "mor")
    t = Table.create(uri, pa.table({"id": ["a", "b/c", "d e"], "ts": [1, 1, 1], "v": [1, 2, 3]}), record_key="id",
                     precombine_field="ts", table_type="merge_on_read", auto_compact="off")  # compact() folds
    batches = [[{"id": "a", "ts": 1, "v": 1}, {"id": "b/c", "ts": 1, "v": 2}, {"id": "d e", "ts": 1, "v": 3}]]
    for i in range(2, 4):
        batch = [{"id": "a", "ts": i, "v": 10 * i}, {"id": "ü", "ts": i, "v": i}]
        t.upsert(pa.Table.from_pylist(batch))
        batches.append(batch)
    # the options object the CLI builds from `compact --min-logs 1 --min-deltas 1`: its table is the handle's
    c = t.compact(CompactOptions(table="elsewhere", min_logs=1, min_deltas=1))
    assert c.executed and c.instant and c.engine == "arrow" and c.counts["logs_folded"] >= 2
    with pytest.raises(BadInputError, match="min_log: not an option of CompactOptions"):
        t.compact(min_log=1)
    with pytest.raises(BadInputError, match="--min-logs must be"):  # the dataclass's own check, as the CLI's
        t.compact(min_logs=-1)
    expect = reduce_batches(batches, key="id", precombine="ts", delete_field=None)
    assert rows(t.read()) == expect
    cl = t.clean(retain_commits=1)
    assert cl.files > 0 and not cl.dry_run
    a = t.alter(add_columns={"note": "string"})
    assert a.changes == ("added note string",) and not a.noop
    assert t.alter(add_columns={"note": "string"}).noop
    assert t.history()[0].action == "commit" and t.history()[0].operation == "alter_schema"
    assert t.rollback().rolled_back == ()
    m = t.mirror(enable="delta")
    assert m.version == t.version() and m.written
    assert t.mirror(repair=True).written == ()
    assert t.validate().ok and t.shadow_compare().ok
    assert t.validate(ValidateOptions(table=uri, engine="arrow")).engine == "arrow"
    assert rows(t.read()) == {k: {**r, "note": None} for k, r in expect.items()}


def test_an_upsert_that_evolves_the_schema_is_marked_by_history_and_show(tmp_path, capsys):
    uri = str(tmp_path / "t")
    t = Table.create(uri, pa.table({"id": ["a b"], "qty": pa.array([1], pa.int32())}), record_key="id")
    t.upsert(pa.table({"id": ["é"], "qty": pa.array([2], pa.int64()), "note": ["n"]}), schema_evolution="all")
    t.upsert(pa.table({"id": ["x"], "qty": pa.array([3], pa.int64()), "note": ["m"]}))
    commits = [h for h in t.history() if h.action == "commit"]  # (the default table also compacts itself)
    evolved = commits[1]
    assert evolved.schema_changes == ("widened qty int -> bigint", "added note string")
    assert commits[0].schema_changes == () and commits[2].schema_changes == ()
    assert t.schema(as_of=commits[2].instant).names == ["id", "qty"]

    assert main(["show", uri, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schema"] == [{"name": "id", "type": "string", "nullable": True},
                           {"name": "qty", "type": "bigint", "nullable": True},
                           {"name": "note", "type": "string", "nullable": True}]
    marked = {c["instant"]: c.get("schema_changes") for c in d["timeline"]}
    assert marked == {**{h.instant: None for h in t.history()}, evolved.instant: list(evolved.schema_changes)}
    assert len(marked) == len(t.history()) >= 3

    assert main(["show", uri]) == 0
    out = capsys.readouterr().out
    assert "schema     3 columns\n  id    string\n  qty   bigint\n  note  string\n" in out
    lines = out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith(evolved.instant))
    assert lines[at + 1].strip() == "schema evolved: widened qty int -> bigint; added note string"
    assert sum("schema evolved" in ln for ln in lines) == 1


def test_import_and_an_arrow_upsert_import_neither_pyspark_nor_airflow(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        # pandas and Polars unimportable: an Arrow batch must never need them (pyarrow itself
        # imports pandas, when installed, to check what pa.array() is given)
        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in ('pandas', 'polars'):
                    raise ImportError(name + ' is not for an Arrow batch')
        sys.meta_path.insert(0, Refuse())
        import spark_jobs
        assert 'pyspark' not in sys.modules and 'airflow' not in sys.modules
        assert 'pyarrow' not in sys.modules  # the names load on first use
        import pyarrow as pa
        from spark_jobs import Table
        t = Table.create({str(tmp_path / 't')!r}, pa.table({{'id': ['a b', 'c/d'], 'v': [1, 2]}}), record_key='id')
        r = t.upsert(pa.table({{'id': ['c/d'], 'v': [3]}}))
        assert r.engine == 'arrow' and r.updated == 1, r
        t.delete(['a b'])
        assert t.read().to_pylist() == [{{'id': 'c/d', 'v': 3}}]
        bad = [m for m in ('pyspark', 'airflow') if m in sys.modules]
        assert not bad, bad
        print('ok', spark_jobs.__version__)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("ok ")


def test_the_package_root_is_curated():
    assert set(spark_jobs.__all__) >= {"Table", "WriteResult", "HistoryEntry", "BadInputError", "ConflictError",
                                       "TableNotFoundError", "__version__"}
    for name in spark_jobs.__all__:
        assert getattr(spark_jobs, name) is not None
    with pytest.raises(AttributeError):
        spark_jobs.no_such_name  # noqa: B018
    with pytest.raises(BadInputError):  # TableNotFoundError: opening is not creating
        Table("/nonexistent/table")


def test_the_readme_python_example_runs_and_its_comments_are_true(tmp_path):
    """The README's "From Python" block, run as a user pastes it, in an empty directory: every
    ``# value`` comment on a print is what it prints, and the table equals the oracle."""
    import re

    text = (ROOT / "README.md").read_text()
    marker = "<!-- readme-python-api:"
    assert text.count(marker) == 1
    block = re.search(r"```python\n(.*?)\n```", text[text.index(marker):], re.S)
    assert block is not None
    p = subprocess.run([sys.executable, "-c", block.group(1)], capture_output=True, text=True, cwd=tmp_path,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr[-2000:]
    printed = p.stdout.splitlines()
    said = [c.split(":")[0].strip() for c in re.findall(r"^print\(.*?\)\s+# (.*)$", block.group(1), re.M)]
    for claim in said:
        if claim.startswith(("order_id", "the ")):
            continue
        assert claim in printed, (claim, printed)
    assert "[('eu', 11.0), ('us', 24.0)]" in printed
    got = rows_by(Table(str(tmp_path / "orders")).read(), "order_id")
    expect = reduce_batches([
        [{"order_id": "A-1", "region": "eu", "updated_at": 1, "amount": 9.5},
         {"order_id": "A-2", "region": "us", "updated_at": 1, "amount": 20.0},
         {"order_id": "Zürich/3", "region": "eu", "updated_at": 1, "amount": 7.25}],
        [{"order_id": "A-1", "region": "eu", "updated_at": 2, "amount": 11.0},
         {"order_id": "B 7", "region": "us", "updated_at": 2, "amount": 3.0}],
        [{"order_id": "A-2", "region": "us", "updated_at": 3, "amount": 21.0}],
        [{"order_id": k, "updated_at": 4, "deleted": True} for k in ("Zürich/3", "no such key")],
    ], key="order_id", precombine="updated_at", delete_field="deleted")
    assert got == expect


def rows_by(t: pa.Table, key: str) -> dict:
    return {r[key]: r for r in t.to_pylist()}


def test_create_without_data_fixes_the_options_and_a_composite_key_deletes_by_tuples(tmp_path):
    uri = str(tmp_path / "t")
    t = Table.create(uri, record_key=["k1", "k2"], partition_field="p")
    assert t.version() == 0 and t.schema() == pa.schema([]) and t.history() == []
    assert t.config["record_key"] == ("k1", "k2") and t.config["partition_fields"] == ("p",)
    batch = [{"k1": "a b", "k2": 1, "p": "x/y", "v": 1}, {"k1": "a b", "k2": 2, "p": "", "v": 2},
             {"k1": "ä%", "k2": 1, "p": None, "v": 3}]
    assert t.upsert(pa.Table.from_pylist(batch)).inserted == 3
    d = t.delete([("a b", 2), ("ä%", 1), ("a b", 9)])
    assert (d.deleted, d.ignored.stale_or_absent_deletes) == (2, 1)
    assert t.read().to_pylist() == [batch[0]]
    with pytest.raises(BadInputError, match="tuple of 2 values"):
        t.delete(["a b"])
    assert t.validate().ok


def test_rehash_runs_in_process_through_the_clis_options_and_keeps_every_row(tmp_path):
    uri = str(tmp_path / "bucketed")
    rows_in = [{"id": k, "region": r, "ts": 1, "v": i} for i, (k, r) in enumerate(
        [("a b", "eu/west"), ("c%2F", "eu/west"), ("ü+1", ""), ("x" * 300, "ap"), ("k", None)])]
    t = Table.create(uri, pa.Table.from_pylist(rows_in), record_key="id", partition_field="region",
                     precombine_field="ts", index="bucket", num_buckets=2)
    r = t.rehash(4)
    assert (r.previous_num_buckets, r.num_buckets, r.noop, r.engine) == (2, 4, False, "arrow")
    expect = reduce_batches([rows_in], key="id", precombine="ts", delete_field=None)
    assert rows(t.read()) == expect and t.validate().ok
    assert t.rehash(4).noop
    with pytest.raises(BadInputError, match="neither a multiple nor a divisor"):
        t.rehash(6)
