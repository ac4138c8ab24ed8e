"""A gap in the commit sequence (issue 36, item 7): an entry deleted by hand, or one planted
past the last, is named in one line (``TableCorruptError``, exit 1) by every verb that needs
the entries around it -- as a damaged entry already is -- never a ``RuntimeError`` traceback.

A gap after the latest checkpoint breaks every verb (each replays the entries after the
checkpoint). A gap before it breaks only the verbs that read that far back (``show``'s
recent history, ``clean``'s retention): they fail the same one-line way, while reads and
writes of the latest snapshot, which the checkpoint covers, keep working.

Real tables written in process, the CLI's output and exit status as a user and the Airflow
operators see them (run in this process by :func:`tests.harness.cli.run_cli`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.table.action.upsert import UpsertOptions
from tests.harness.cli import run_cli
from tests.unit.test_cli_newcomer import tree_digest

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("v", pa.int64())])
COMMITS = 13  # one checkpoint (after entry 10, the default interval), three entries after it


def _seq(root: Path, n: int) -> Path:
    return root / ".bucketindex" / "sequence" / f"{n:020d}.json"


def _source(d: Path, i: int) -> str:
    rows = [{"id": f"k {i} /%+é", "region": [None, "", "eu west", "ü/x"][i % 4], "v": i},
            {"id": "shared key", "region": "eu west", "v": i}]
    p = d / f"b{i}" / "part-0.parquet"
    p.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), p)
    return str(p)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, str]:
    d = tmp_path_factory.mktemp("gap")
    uri = str(d / "t")
    for i in range(COMMITS):
        run_upsert(UpsertOptions(table=uri, source=_source(d / "in", i), record_key=["id"],
                                 partition_field="region", batch_id=f"b{i}",
                                 table_type="copy_on_write"))  # one entry per upsert: COMMITS entries
    assert (d / "t" / ".bucketindex" / "checkpoints" / f"{10:020d}.json").exists()
    assert _seq(d / "t", COMMITS).exists() and not _seq(d / "t", COMMITS + 1).exists()
    return d, _source(d / "in", COMMITS)


def _copy(pristine: tuple[Path, str], tmp_path: Path) -> Path:
    root = tmp_path / "t"
    shutil.copytree(pristine[0] / "t", root)
    return root


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    return run_cli(*args, timeout=120, env=env)


def _verbs(root: Path, src: str) -> dict[str, tuple[str, ...]]:
    t = str(root)
    return {"upsert": ("upsert", t, src, "--engine", "arrow"), "read": ("read", t), "show": ("show", t),
            "validate": ("validate", t, "--engine", "arrow"), "clean": ("clean", t),
            "compact": ("compact", t, "--engine", "arrow")}


def _assert_named(p: subprocess.CompletedProcess, *paths: Path) -> None:
    assert p.returncode == 1, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    for path in paths:
        assert str(path) in lines[0], lines[0]


def test_a_deleted_entry_after_the_checkpoint_is_named_by_every_verb(pristine, tmp_path):
    root = _copy(pristine, tmp_path)
    _seq(root, 11).unlink()
    before = tree_digest(root)
    for verb, argv in _verbs(root, pristine[1]).items():
        p = _cli(*argv)
        _assert_named(p, _seq(root, 11), _seq(root, 12))
        assert "commit sequence entry" in p.stderr, (verb, p.stderr)
        assert tree_digest(root) == before, verb  # nothing written, not even by a write verb


def test_a_planted_entry_is_named_with_the_gap_before_it(pristine, tmp_path):
    root = _copy(pristine, tmp_path)
    planted = json.loads(_seq(root, COMMITS).read_text())
    planted["seq"] = 99
    _seq(root, 99).write_text(json.dumps(planted))
    before = tree_digest(root)
    for verb, argv in _verbs(root, pristine[1]).items():
        p = _cli(*argv)
        _assert_named(p, _seq(root, 99), _seq(root, COMMITS + 1))
        assert f"entries {COMMITS + 1}-98" in p.stderr, (verb, p.stderr)
        assert tree_digest(root) == before, verb


def test_a_copied_entry_that_says_it_is_another_is_named(pristine, tmp_path):
    root = _copy(pristine, tmp_path)
    shutil.copy(_seq(root, COMMITS), _seq(root, COMMITS + 1))  # claims to be entry 13
    p = _cli("read", str(root))
    _assert_named(p, _seq(root, COMMITS + 1))
    assert f"it says it is entry {COMMITS}" in p.stderr


def test_a_gap_before_the_checkpoint_fails_only_the_verbs_that_read_it(pristine, tmp_path):
    root = _copy(pristine, tmp_path)
    _seq(root, 5).unlink()
    before = tree_digest(root)
    verbs = _verbs(root, pristine[1])
    for verb in ("show", "clean"):  # they read recent history past the checkpoint
        _assert_named(_cli(*verbs[verb]), _seq(root, 5), _seq(root, 6))
        assert tree_digest(root) == before, verb
    for verb in ("read", "validate", "compact"):  # the checkpoint covers entry 5
        p = _cli(*verbs[verb])
        assert p.returncode == 0, (verb, p.stderr[-2000:])
