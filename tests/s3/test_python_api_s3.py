"""The Python API on an S3 table reached only through ``Table(..., storage_options=...)``: no
``AWS_*`` variable in the environment, and the process's run options left as they were after
every call (a library call must not change what other tables of the process use)."""

from __future__ import annotations

import uuid

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from spark_jobs import Table, TableNotFoundError
from spark_jobs.io import storage
from tests.oracle import reduce_batches


@pytest.fixture
def bare(s3_server, monkeypatch):  # type: ignore[no-untyped-def]
    """The server with no credentials in the environment: only storage options reach it."""
    for k in list(s3_server.env()) + ["AWS_PROFILE", "BUCKETINDEX_STORAGE_OPTIONS"]:
        monkeypatch.delenv(k, raising=False)
    storage.configure(None)
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    yield s3_server, f"s3://{name}/orders"
    storage.configure(None)


def test_storage_options_reach_the_store_and_are_put_back(bare):
    server, uri = bare
    opts = server.options()
    first = [{"id": "a b", "region": "eu/west", "ts": 1, "v": 1.0}, {"id": "ü%", "region": "", "ts": 1, "v": 2.0}]
    t = Table.create(uri, pd.DataFrame(first), record_key="id", partition_field="region",
                     precombine_field="ts", storage_options=opts)
    assert storage.configured() == {}
    second = [{"id": "a b", "region": "eu/west", "ts": 2, "v": 3.0}, {"id": "c+d", "region": "us", "ts": 1, "v": 4.0}]
    r = t.upsert(pl.DataFrame(second))
    assert (r.inserted, r.updated, r.engine) == (1, 1, "arrow")
    t.delete(["ü%"], precombine=5)
    assert storage.configured() == {}
    expect = reduce_batches([first, second, [{"id": "ü%", "ts": 5, "is_deleted": True}]], key="id")
    again = Table(uri, storage_options=opts)
    assert {row["id"]: row for row in again.read().to_pylist()} == expect
    assert again.to_pyarrow_dataset().to_table().num_rows == len(expect)
    seqs = [e.sequence for e in again.history()]  # newest first, every entry (automatic compactions too)
    assert again.validate().ok and seqs == list(range(len(seqs), 0, -1))
    assert sum(e.action == "commit" for e in again.history()) == 3
    assert storage.configured() == {}
    from botocore.exceptions import NoCredentialsError

    with pytest.raises((TableNotFoundError, OSError, NoCredentialsError)):  # without them: out of reach
        Table(uri)
