"""One local Spark session for the whole run (2 cores: starting more is the slowest thing we could do)."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


@pytest.fixture(scope="session")
def spark():
    from spark_jobs.jobs.session import get_spark

    s = get_spark("local[2]", app_name="bucketindex-tests")
    yield s
    s.stop()
    # py4j logs "Closing down clientserver connection" at INFO from __del__ during interpreter
    # shutdown, after pytest has closed the stream Airflow's logging config points at.
    logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def spark_cli_args() -> list[str]:
    """How a CLI subprocess reaches Spark in this tier (tests/connect: ``--remote``)."""
    return ["--master", "local[2]"]


def write_batch(path: Path, rows: list[dict], schema: pa.Schema | None = None) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


def tree_digest(root: Path) -> dict[str, str]:
    """path -> sha256 of every file under ``root``: to prove a failed run wrote nothing."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out
