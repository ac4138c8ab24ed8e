"""``@task.bucketindex_upsert``'s operator called directly (no DAG run): what it does with each
kind of return value, and what its errors say. The ``dag.test()`` runs against the oracle are in
``tests/airflow/test_taskflow_e2e.py``."""

from __future__ import annotations

import glob
import os
import tempfile

import pyarrow as pa
import pytest

from airflow_provider_bucketindex.demo import sandbox

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def decorated():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex.decorators import upsert

    return upsert._BucketIndexUpsertDecoratedOperator


def _op(decorated, fn, table: str, **kw):  # type: ignore[no-untyped-def]
    return decorated(task_id="u", python_callable=fn, table_uri=table, record_key="id", engine="arrow",
                     batch_id=kw.pop("batch_id", "b-1"), do_xcom_push=False, **kw)


def _temp_batches() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "bucketindex-batch-*")))


def test_an_in_memory_batch_is_upserted_and_its_temporary_file_removed(decorated, tmp_path):  # type: ignore[no-untyped-def]
    from spark_jobs.api import Table

    before = _temp_batches()
    table = str(tmp_path / "t")
    out = _op(decorated, lambda: pa.table({"id": ["a b", "x/y"], "v": [1, None]}), table).execute({})
    assert (out["inserted"], out["engine"], out["batch_id"]) == (2, "arrow", "b-1")
    assert sorted(Table(table).read().to_pylist(), key=lambda r: r["id"]) == [{"id": "a b", "v": 1},
                                                                              {"id": "x/y", "v": None}]
    assert _temp_batches() == before


def test_bad_input_names_the_functions_batch_not_its_temporary_file(decorated, tmp_path):  # type: ignore[no-untyped-def]
    """An empty batch is bad input whose message names the source: the function's batch, as the
    Python API names it, not the temporary file it was written to (removed by now)."""
    from airflow.sdk.exceptions import AirflowFailException

    empty = pa.table({"id": pa.array([], pa.string()), "v": pa.array([], pa.int64())})
    with pytest.raises(AirflowFailException) as info:
        _op(decorated, lambda: empty, str(tmp_path / "t")).execute({})
    text = str(info.value)
    assert "is empty" in text and "the Arrow batch" in text and "bucketindex-batch-" not in text, text
    with pytest.raises(AirflowFailException, match="null or empty record key"):
        _op(decorated, lambda: pa.table({"id": ["k", None], "v": [1, 2]}), str(tmp_path / "t")).execute({})


@pytest.mark.parametrize("returned,match", [(None, "returned None"), ({"id": ["k"]}, "cannot upsert a dict"),
                                            ("  ", "empty path")])
def test_what_is_no_batch_fails_without_retries_before_any_write(decorated, tmp_path, returned, match):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match=match):
        _op(decorated, lambda: returned, str(tmp_path / "t")).execute({})
    assert not (tmp_path / "t").exists()
