"""``read`` and ``validate`` on the in-process engine, without Spark: hand-made commits (as in
test_table_format), the report's rules (``spark_jobs.table.validation``) and the CLI's choice.
tests/spark/test_validate.py holds both engines to equal reports on tables Spark wrote."""

from __future__ import annotations

import os

import pytest

from spark_jobs.arrow_engine import read as arrow_read
from spark_jobs.arrow_engine.validate import needed_bytes, run_validate
from spark_jobs.cli import main
from spark_jobs.index.hashing import bucket_of
from spark_jobs.table import validation
from tests.unit.test_table_format import new_table, write_commit

pytestmark = pytest.mark.unit


def test_report_of_hand_made_table(tmp_path):
    """write_commit puts every entry in bucket 0: the keys of bucket 1 are each an entry in the
    wrong bucket, sampled smallest first; a deleted data file is then the only finding."""
    t = new_table(tmp_path)
    keys = [f"k{i:02d}" for i in range(12)]
    write_commit(t, [(k, i) for i, k in enumerate(keys)])
    report = run_validate(t.uri)
    misplaced = sorted(k for k in keys if bucket_of(k, 2) == 1)
    assert report == {"rows": 12, "rows_expected": 12, "index_type": "record", "index_entries": 12, "ok": False,
                      "problems": {"index_entries_in_wrong_bucket": {"count": len(misplaced),
                                                                     "samples": misplaced[:validation.SAMPLES]}}}
    os.remove(t.abs(t.view().slices()[0].path))
    report = run_validate(t.uri)
    assert not report["ok"] and list(report["problems"]) == ["data_files_missing"] and report["rows"] == 0


def test_row_count_rule():
    from spark_jobs.table.view import FileSlice, FileSystemView

    view = FileSystemView(as_of=None, file_groups={("p", "a"): FileSlice("p", "a", "p/a.parquet", "1", 3),
                                                   ("p", "b"): FileSlice("p", "b", "p/b.parquet", "1", 2)})
    assert validation.row_count_mismatches(view, {("p", "a"): 3, ("p", "b"): 2}) == []
    assert validation.row_count_mismatches(view, {("p", "a"): 1, ("q", "c"): 4}) == [
        "p/a: expected 3, read 1", "p/b: expected 2, read 0", "q/c: expected none, read 4"]


def test_cli_read_and_validate_in_process(tmp_path, capsys, caplog):
    t = new_table(tmp_path)
    write_commit(t, [("a", 1), ("b", 2)])
    write_commit(t, [("c", None)], file_id="fg2")
    assert main(["read", t.uri, "--engine", "arrow", "--limit", "2"]) == 0
    assert capsys.readouterr().out == "+--+-+\n|id|v|\n+--+-+\n|a |1|\n|b |2|\n+--+-+\nonly showing top 2 rows\n"
    with caplog.at_level("INFO", logger="bucketindex.engine"):
        assert main(["read", t.uri]) == 0  # auto: a small table is read in this process
    assert capsys.readouterr().out.splitlines()[-2] == "|c |NULL|"
    assert any(r.getMessage().startswith("engine: arrow (needs about") for r in caplog.records)
    assert main(["validate", t.uri, "--engine", "arrow"]) == 1  # every entry in bucket 0: some are misplaced
    assert '"index_entries_in_wrong_bucket"' in capsys.readouterr().out
    assert main(["validate", t.uri, "--engine", "arrow", "--master", "local[1]"]) == 2
    assert "--engine arrow runs in-process" in capsys.readouterr().err
    assert main(["read", t.uri, "--memory-budget", "lots"]) == 2


def test_needed_bytes_grow_with_the_work(tmp_path):
    t = new_table(tmp_path)
    write_commit(t, [("a", 1), ("b", 2)])
    write_commit(t, [("c", 3)], file_id="fg2")
    view = t.view()
    view.file_groups = {k: s.__class__(**{**s.__dict__, "size": 1000}) for k, s in view.file_groups.items()}
    assert arrow_read.needed_bytes(view, 1) < arrow_read.needed_bytes(view, 3) == arrow_read.needed_bytes(view)
    assert needed_bytes(t, view) > needed_bytes(t, t.view())
