"""Memory on the in-process engine (issue 36, item 9).

* running out of memory while reading a source is a resource failure -- exit 1, one line naming
  the budget setting, the table untouched -- never bad input (exit 2, which Airflow does not
  retry): the CLI runs under an address-space limit (``RLIMIT_AS``, as ``prlimit --as`` sets)
  on a batch that decodes to far more than the limit;
* ``--engine arrow`` with a budget the user set (``--memory-budget`` or
  ``$BUCKETINDEX_ARROW_MEMORY_BUDGET``) is held to it: work estimated over it is refused before
  anything is written (exit 2: the command contradicts itself, and a retry would meet the same
  refusal), work within it runs.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.unit.test_cli_newcomer import tree_digest

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("v", pa.string())])
ROWS = [{"id": "a b", "region": "eu/west", "v": "1"}, {"id": "50%+", "region": None, "v": "2"},
        {"id": "Zoë", "region": "", "v": "3"}]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "BUCKETINDEX_ARROW_MEMORY_BUDGET")}
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str] | None = None, address_space: int | None = None) -> subprocess.CompletedProcess:
    def limit() -> None:  # in the child only: `prlimit --as=...`
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    return subprocess.run([sys.executable, "-m", "spark_jobs.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env or _env(), preexec_fn=limit)


@pytest.fixture()
def table(tmp_path: Path) -> tuple[Path, str]:
    uri = str(tmp_path / "t")
    src = tmp_path / "in" / "b1.parquet"
    src.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(ROWS, schema=SCHEMA), src)
    p = cli("upsert", uri, str(src), "--record-key", "id", "--partition-field", "region", "--engine", "arrow")
    assert p.returncode == 0, p.stderr
    return tmp_path, uri


def _huge_batch(path: Path, *, rows: int, width: int) -> None:
    """A batch of a few MB on disk that decodes to ``rows * width`` bytes: one long value,
    dictionary-encoded (written without ever being materialised here), read back as plain
    strings: the reader runs out of memory inside pyarrow's read, the case that was exit 2."""
    value = pa.array(["é" + "x" * (width - 2)])
    ids = pa.array([f"k {i % 1000}/{i}" for i in range(rows)])
    col = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), value)
    region = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["eu/west"]))
    # without the Arrow schema a reader decodes the values as plain strings inside the read itself
    pq.write_table(pa.table({"id": ids, "region": region, "v": col}), path, compression="zstd", store_schema=False)


def test_out_of_memory_reading_a_source_exits_1_naming_the_budget_and_leaves_the_table(table):
    d, uri = table
    src = d / "in" / "huge.parquet"
    _huge_batch(src, rows=1_000_000, width=2000)  # ~2 GB decoded, ~1 MB on disk
    assert src.stat().st_size < 64 << 20
    before = tree_digest(Path(uri))
    for engine in ("arrow", "auto"):  # auto sizes it from the file (small): arrow, which runs out
        p = cli("upsert", uri, str(src), "--engine", engine, address_space=1500 << 20)
        assert p.returncode == 1, (p.returncode, p.stderr[-2000:])
        line = p.stderr.strip().splitlines()[-1]
        assert "Traceback" not in p.stderr, p.stderr[-2000:]
        assert line.startswith("bucketindex: upsert failed: out of memory"), line
        assert "--memory-budget" in line and "BUCKETINDEX_ARROW_MEMORY_BUDGET" in line, line
        assert tree_digest(Path(uri)) == before


def test_a_thread_that_cannot_start_is_out_of_memory_not_a_traceback():
    from spark_jobs.resources import describe_resource_failure

    try:
        raise RuntimeError("can't start new thread")
    except RuntimeError as e:
        line = describe_resource_failure(e)
    assert line is not None and line.startswith("out of memory") and "--memory-budget" in line, line
    # Arrow's own thread pool, under the same limit (seen reading a source under RLIMIT_AS at load ~14)
    import pyarrow as pa

    arrow = pa.ArrowException("Unknown error: Failed to launch worker thread: Resource temporarily unavailable")
    line = describe_resource_failure(arrow)
    assert line is not None and line.startswith("out of memory"), line


def _batch(d: Path, name: str, rows: int) -> str:
    path = d / "in" / name
    pq.write_table(pa.table({"id": [f"n {i}%" for i in range(rows)], "region": ["eu/west"] * rows,
                             "v": [str(i) * 20 for i in range(rows)]}), path)
    return str(path)


@pytest.mark.parametrize("how", ["option", "environment"])
def test_engine_arrow_refuses_work_over_the_budget_the_user_set(table, how):
    d, uri = table
    src = _batch(d, "medium.parquet", 200_000)  # a few MB on disk: tens of MB planned
    before = tree_digest(Path(uri))
    args = ("--memory-budget", "1m") if how == "option" else ()
    env = _env(BUCKETINDEX_ARROW_MEMORY_BUDGET="1m") if how == "environment" else None
    p = cli("upsert", uri, src, "--engine", "arrow", *args, env=env)
    assert p.returncode == 2, p.stderr[-2000:]
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "--memory-budget" in p.stderr and "1 MiB budget" in p.stderr, p.stderr
    assert tree_digest(Path(uri)) == before
    for verb in (("read",), ("validate",)):  # the in-process verbs that size their work say the same
        q = cli(*verb, uri, "--engine", "arrow", "--memory-budget", "1k")
        assert q.returncode == 2 and "--memory-budget" in q.stderr, q.stderr
    # within the budget it runs, and the commit says how much it planned
    ok = cli("upsert", uri, src, "--engine", "arrow", "--memory-budget", "4g")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout.strip().splitlines()[-1])["counts"]["inserted"] == 200_000


def test_engine_arrow_without_a_budget_set_is_not_sized(table):
    d, uri = table  # the derived default only steers auto: an explicit arrow run is the user's call
    p = cli("upsert", uri, _batch(d, "small.parquet", 10), "--engine", "arrow")
    assert p.returncode == 0, p.stderr
