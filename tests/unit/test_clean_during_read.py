"""``clean`` while a snapshot is being read (issue 36, item 11): the file it removed is not
"missing (deleted outside bucketindex?)" -- the read says the snapshot left the retained
window while it was being read, naming the snapshot and the clean: exit 2 for ``--as-of`` (the
same read afterwards says "older than the retained window"), exit 3 for the latest snapshot
(a retry reads the new latest). A file deleted outside bucketindex is still named as lost.

Deterministic: the view is built, the clean runs, then the view's files are read
(``reader.read_view``, the second half of ``read_arrow``).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.compact import run_compact
from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.cli import main
from spark_jobs.exceptions import BadInputError, RetryableError, TableCorruptError
from spark_jobs.table.action.clean import run_clean
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.dataset import snapshot_dataset
from spark_jobs.table.reader import read_view
from spark_jobs.table.table import Table

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("v", pa.int64())])


def _table(tmp_path: Path, table_type: str = "copy_on_write", commits: int = 3) -> tuple[str, list[str]]:
    """``commits`` upserts of the same keys (every one rewrites every file group); their instants."""
    uri = str(tmp_path / "t")
    instants = []
    for i in range(commits):
        src = tmp_path / f"b{i}.parquet"
        pq.write_table(pa.Table.from_pylist(
            [{"id": k, "region": r, "v": i} for k, r in [("a b/%+é", "eu west"), ("Zoë", None), ("", ""), ("x", "ü/x")]
             if k], schema=SCHEMA), src)
        out = run_upsert(UpsertOptions(table=uri, source=str(src), record_key=["id"], partition_field="region",
                                       batch_id=f"b{i}", table_type=table_type))
        instants.append(out["instant"])
    return uri, instants


def test_an_as_of_read_whose_snapshot_clean_removed_says_so(tmp_path, capsys):
    uri, instants = _table(tmp_path)
    table = Table.load(uri)
    view = table.view(instants[0])
    assert run_clean(uri, retain_commits=1)["files"] > 0
    with pytest.raises(BadInputError) as e:
        read_view(table, view)
    msg = str(e.value)
    assert msg.startswith(f"--as-of {instants[0]} left the retained window while it was being read: clean ")
    assert "deleted outside bucketindex" not in msg and "\n" not in msg
    # afterwards the same read is refused up front, in the same words' class (exit 2)
    assert main(["read", uri, "--as-of", instants[0], "--engine", "arrow"]) == 2
    assert "older than the retained window" in capsys.readouterr().err


def test_a_latest_read_overtaken_by_commits_and_a_clean_is_retryable(tmp_path):
    uri, _ = _table(tmp_path, commits=1)
    table = Table.load(uri)
    view = table.view()  # the latest snapshot when the read began
    _table(tmp_path, commits=3)  # two more commits (b0 again is a no-op), then a clean of the old files
    assert run_clean(uri, retain_commits=1)["files"] > 0
    with pytest.raises(RetryableError, match=rf"^the latest snapshot when the read began \(sequence entry "
                                             rf"{view.seq}\) left the retained window while it was being read"):
        read_view(table, view)
    assert {r["v"] for r in read_view(table, Table.load(uri).view()).to_pylist()} == {2}  # a retry reads


def test_a_file_deleted_outside_bucketindex_is_still_named_as_lost(tmp_path):
    uri, _ = _table(tmp_path)
    table = Table.load(uri)
    view = table.view()
    lost = table.abs(view.slices()[0].path)
    Path(lost).unlink()
    with pytest.raises(TableCorruptError, match="missing \\(deleted outside bucketindex\\?\\)") as e:
        read_view(table, view)
    assert e.value.path == lost


def test_a_merged_slice_of_a_cleaned_snapshot_names_the_clean(tmp_path):
    """dataset() over merge-on-read: a slice merged after a clean removed its files says why."""
    uri, instants = _table(tmp_path, table_type="merge_on_read")
    table = Table.load(uri)
    view = table.view(instants[1])
    assert any(s.logs for s in view.slices())
    ds = snapshot_dataset(table, view)
    run_compact(uri)  # new bases: the slices' old base and logs are no longer in the latest snapshot
    assert run_clean(uri, retain_commits=1)["files"] > 0
    with pytest.raises(BadInputError, match=f"^--as-of {instants[1]} left the retained window while it was being read"):
        ds.to_table()
