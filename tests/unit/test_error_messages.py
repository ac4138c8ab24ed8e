"""Errors that name their cause, without Spark: which disk filled up, temp files of a failed
atomic create, ``--as-of`` values, damaged metadata files (issue 22, D5/D6)."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from spark_jobs import cli
from spark_jobs.exceptions import BadInputError, TableCorruptError, UnsupportedStorageError
from spark_jobs.io.filesystem import HadoopFileIO, LocalFileIO
from spark_jobs.resources import describe_resource_failure
from spark_jobs.table.config import TableConfig
from spark_jobs.table.timeline import check_instant

pytestmark = pytest.mark.unit

SPARK_DISK = RuntimeError("An error occurred while calling o93.count.\n: org.apache.spark.SparkException: "
                          "java.io.IOException: No space left on device\n\tat ...")


def test_a_full_spark_local_dir_is_not_blamed_on_the_table(tmp_path):
    msg = describe_resource_failure(SPARK_DISK, master="local[2]", table_root=str(tmp_path / "t"))
    assert msg is not None and "spark.local.dir" in msg and "table's storage" not in msg


def test_a_full_table_is_named_with_its_path(tmp_path):
    root = str(tmp_path / "t")
    err = OSError(errno.ENOSPC, "No space left on device", f"{root}/.bucketindex/timeline/1.commit.requested")
    msg = describe_resource_failure(err, table_root=root)
    assert msg is not None and "the table's storage is full" in msg and root in msg and "spark.local.dir" not in msg


def test_a_full_driver_disk_names_the_output(tmp_path):
    out = str(tmp_path / "snap.parquet")
    err = OSError(errno.ENOSPC, "[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device")
    msg = describe_resource_failure(err, table_root=str(tmp_path / "t"), output=out)
    assert msg is not None and "driver's disk" in msg and out in msg


@pytest.mark.parametrize("fail", ["write", "link"])
def test_create_exclusive_and_write_atomic_leave_no_temp_file(tmp_path, monkeypatch, fail):
    io = LocalFileIO(pafs.LocalFileSystem())
    target = str(tmp_path / "timeline" / "1.commit.requested")

    def full(*a, **k):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync" if fail == "write" else "link", full)
    with pytest.raises(OSError) as e:
        io.create_exclusive(target, b"{}")
    assert e.value.errno == errno.ENOSPC
    if fail == "write":
        assert e.value.filename == target  # named, so the CLI can say which storage is full
        monkeypatch.setattr(os, "replace", full)
        with pytest.raises(OSError):
            io.write_atomic(str(tmp_path / "timeline" / "hb.json"), b"{}")
    assert os.listdir(tmp_path / "timeline") == []


def test_hadoop_create_exclusive_is_refused_and_writes_nothing(tmp_path):
    """HDFS has no create-if-absent pyarrow can make (its rename replaces a file): the commit
    primitive refuses in one line instead of racing (format.md §10), and writes no temp file."""
    io = HadoopFileIO(pafs.LocalFileSystem())  # the HDFS code path over a local filesystem
    (tmp_path / "d").mkdir()
    with pytest.raises(UnsupportedStorageError, match=r"^tables on hdfs:// are not supported yet: .*create"):
        io.create_exclusive(str(tmp_path / "d" / "f.json"), b"{}")
    assert os.listdir(tmp_path / "d") == []
    assert not io.supports_exclusive_create


@pytest.mark.parametrize("value", ["yesterday", "2024-01-01", "20240101", "202401011200000000", "20241301000000000"])
def test_as_of_must_be_an_instant(value):
    with pytest.raises(BadInputError, match="is not an instant"):
        check_instant(value, option="--as-of")
    assert check_instant("20240101120000000", option="--as-of") == "20240101120000000"


def test_damaged_table_json_is_named(tmp_path):
    io = LocalFileIO(pafs.LocalFileSystem())
    path = str(tmp_path / "table.json")
    Path(path).write_bytes(TableConfig(record_key_fields=["id"]).to_json()[:40])
    with pytest.raises(TableCorruptError, match=r"table metadata .*table\.json is damaged \(not valid JSON"):
        TableConfig.load(io, path)
    Path(path).write_text(json.dumps([1, 2]))
    with pytest.raises(TableCorruptError, match="not a table configuration"):
        TableConfig.load(io, path)


def test_cli_read_checks_as_of_and_output_before_reading(tmp_path, capsys):
    table = str(tmp_path / "no-table-needed")
    assert cli.main(["read", table, "--as-of", "yesterday"]) == 2
    assert cli.main(["read", table, "--output", str(tmp_path / "missing" / "x.parquet")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("bucketindex:")]
    assert len(err) == 2 and "'yesterday' is not an instant" in err[0]
    assert f"directory {tmp_path / 'missing'} does not exist" in err[1]
    assert not (tmp_path / "missing").exists()


def test_cli_table_path_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    assert cli.main(["show", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"bucketindex: error: table path {f} is a file, not a table directory"]
    assert f.read_text() == "x"


@pytest.mark.parametrize("argv", [["rollback", "{t}", "../../x"], ["compact", "{t}", "--execute", "/etc/passwd"]])
def test_cli_instant_arguments_must_be_instants(tmp_path, capsys, argv):
    """An instant names files (markers, plans): one that is not 17 digits is refused before the
    table is touched, so ``../../x`` can never reach a path. (``shadow-compare --since`` takes
    a prefix of an instant and is checked by ``shadow.check_options``: tests/spark/test_shadow_compare.py.)"""
    from spark_jobs.table.table import Table

    t = Table.open(str(tmp_path / "t"))
    t.create(TableConfig(record_key_fields=["id"]))
    outside = tmp_path / "x"
    outside.mkdir()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert cli.main([a.format(t=t.uri) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bucketindex: error: ") and "is not an instant" in err[0], err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_an_unwritable_spark_log_falls_back_to_a_temp_file(tmp_path, monkeypatch):
    """The Spark log is ours, not the table's: a log path we cannot open must not fail the run
    with 'permission denied ... grant this user access to the table's files'."""
    import argparse

    from spark_jobs.jobs import session

    opened = []
    monkeypatch.setenv("BUCKETINDEX_SPARK_LOG", str(tmp_path / "no-such-dir" / "spark.log"))
    monkeypatch.setattr(session, "get_spark", lambda *a, **k: opened.append(os.readlink("/proc/self/fd/2")) or "s")
    args = argparse.Namespace(remote=None, master="local[1]", driver_memory=None, verbose=False)
    assert cli._spark(args, False) == "s"
    assert opened and opened[0].startswith(os.path.join(tempfile.gettempdir(), "bucketindex-spark-"))
    os.unlink(opened[0])
