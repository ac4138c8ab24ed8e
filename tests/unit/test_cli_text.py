"""What the CLI says to a newcomer (issue 24 item 4): help text for every argument of every verb,
counts with the right plural form, and bucketindex's own files (Spark logs, the demo's work
folders) in one documented place, cleaned. No JVM: the log-file rules are functions of
``spark_jobs.home`` and of ``cli.main``'s exit status."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs import cli, home
from spark_jobs.text import plural

#: verbs whose arguments need no help text (none: a newcomer reads every one)
EXEMPT_VERBS: set[str] = set()


def _undocumented(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name not in EXEMPT_VERBS:
                    out += _undocumented(sub, (*path, name))
        elif not isinstance(action, argparse._HelpAction) and not (action.help or "").strip():
            out.append(f"{' '.join(path) or 'bucketindex'} {'/'.join(action.option_strings) or action.dest}")
    return out


def test_every_argument_of_every_verb_has_help_text():
    from airflow_provider_bucketindex.cli import CONNECT_SERVER_HELP, DEMO_HELP

    parser = cli.build_parser({"demo": DEMO_HELP, "connect-server": CONNECT_SERVER_HELP})
    assert _undocumented(parser) == []
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"read", "show", "validate", "shadow-compare", "rollback", "compact", "clean", "rehash",
            "bootstrap", "demo", "connect-server"} <= set(verbs.choices)
    for action in verbs._choices_actions:  # each verb's one-line summary in `bucketindex --help`
        assert (action.help or "").strip(), action.dest


def test_the_demo_and_connect_server_parsers_document_every_option():
    import inspect

    from airflow_provider_bucketindex.demo.runner import _parser
    from spark_jobs.jobs import connect

    assert _undocumented(_parser()) == []
    assert "--keep" in _parser().format_help()
    source = inspect.getsource(connect)  # its parser is built inside serve(): every add_argument has help=
    calls = source.split("p.add_argument(")[1:]
    assert calls and all("help=" in c.split("\n    p.")[0] for c in calls)


def test_as_of_and_since_help_name_the_accepted_forms():
    parser = cli.build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    read_help = verbs["read"].format_help()
    for form in ("INSTANT|TIME", "17 digits", "2026-11-25T09:24:00+01:00", "UTC"):
        assert form in " ".join(read_help.split()), form
    assert "INSTANT|TIME" in verbs["shadow-compare"].format_help()


@pytest.mark.parametrize("n, noun, said", [
    (0, "file group", "0 file groups"), (1, "file group", "1 file group"), (2, "file group", "2 file groups"),
    (1, "delta", "1 delta"), (3, "delta", "3 deltas"), (1, "row", "1 row"), (1, "log file", "1 log file"),
    (2, "entry", "2 entries"), (1, "entry", "1 entry"), (2, "mismatch", "2 mismatches"), (2, "index", "2 indexes"),
    (2, "day", "2 days"), (2, "batch", "2 batches"), (5, "person", "5 people"),
])
def test_plural(n, noun, said):
    assert plural(n, noun, "people" if noun == "person" else None) == said


def _table(tmp_path: Path) -> str:
    """A one-row table (in-process engine): `show` of it is what a newcomer reads first."""
    from spark_jobs.arrow_engine.upsert import run_upsert
    from spark_jobs.table.action.upsert import UpsertOptions

    src = tmp_path / "one.parquet"
    pq.write_table(pa.table({"id": ["k 1/é%+"], "ts": [1]}), src)
    uri = str(tmp_path / "t")
    run_upsert(UpsertOptions(table=uri, source=str(src), record_key=["id"], precombine_field="ts", num_buckets=1))
    return uri


def test_show_counts_in_the_singular(tmp_path, capsys):
    uri = _table(tmp_path)
    assert cli.main(["show", uri]) == 0
    out = capsys.readouterr().out
    assert "1 row in 1 file group, 1 partition," in out
    assert "(1 bucket)" in out and "1 completed instant;" in out
    for wrong in ("1 rows", "1 file groups", "1 partitions", "1 buckets", "1 deltas", "1 files", "1 instants"):
        assert wrong not in out, wrong


def test_bucketindex_home_and_its_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv("BUCKETINDEX_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert home.home() == str(tmp_path / "cache" / "bucketindex")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    assert home.home() == str(tmp_path / "me" / ".cache" / "bucketindex")
    monkeypatch.setenv("BUCKETINDEX_HOME", str(tmp_path / "bi"))
    assert (home.logs_dir(), home.demo_dir()) == (str(tmp_path / "bi" / "logs"), str(tmp_path / "bi" / "demo"))


def test_spark_log_is_deleted_on_success_kept_on_failure_and_pruned(tmp_path, monkeypatch):
    monkeypatch.setenv("BUCKETINDEX_HOME", str(tmp_path / "bi"))
    monkeypatch.delenv("BUCKETINDEX_SPARK_LOG", raising=False)
    logs = tmp_path / "bi" / "logs"
    for i in range(home.KEEP_LOGS + 5):  # old failed runs' logs
        old = logs / f"spark-2020010{i:02d}-{i}.log"
        old.parent.mkdir(parents=True, exist_ok=True)
        old.write_text("old")
        os.utime(old, (time.time() - 1000 + i, time.time() - 1000 + i))
    fd, path, owned = home.open_spark_log()
    os.write(fd, b"JVM chatter\n")
    os.close(fd)
    assert owned and os.path.dirname(path) == str(logs) and os.path.basename(path).startswith("spark-")
    kept = sorted(p.name for p in logs.iterdir())
    assert len(kept) == home.KEEP_LOGS and os.path.basename(path) in kept
    assert "spark-202001000-0.log" not in kept  # the oldest went
    assert home.finish_spark_log(path, ok=False, owned=True) and Path(path).read_text() == "JVM chatter\n"
    assert not home.finish_spark_log(path, ok=True, owned=True) and not os.path.exists(path)


def test_a_named_spark_log_is_the_users(tmp_path, monkeypatch):
    mine = tmp_path / "my-spark.log"
    monkeypatch.setenv("BUCKETINDEX_SPARK_LOG", str(mine))
    fd, path, owned = home.open_spark_log()
    os.close(fd)
    assert (path, owned) == (str(mine), False)
    assert home.finish_spark_log(path, ok=True, owned=False) and mine.exists()  # never deleted


def test_main_deletes_the_run_s_spark_log_only_when_the_run_succeeds(tmp_path, monkeypatch, capsys):
    """``main`` settles the logs ``_spark`` opened by the run's exit status (the JVM side is
    ``_spark``'s, tested with Spark; here the log is registered as ``_spark`` registers it)."""
    monkeypatch.setenv("BUCKETINDEX_HOME", str(tmp_path / "bi"))
    monkeypatch.delenv("BUCKETINDEX_SPARK_LOG", raising=False)
    uri = _table(tmp_path)
    for argv, status, stays in ((["show", uri], 0, False), (["read", uri, "--as-of", "soon"], 2, True)):
        fd, path, owned = home.open_spark_log()
        os.close(fd)
        cli._SPARK_LOG.append((path, owned))
        assert cli.main(argv) == status
        assert os.path.exists(path) is stays and not cli._SPARK_LOG
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bucketindex: error: --as-of must be an instant or a time: 'soon'")


def test_demo_names_runs_after_their_logical_dates():
    from datetime import datetime, timezone

    from airflow_provider_bucketindex.demo.runner import _run_id

    assert _run_id(datetime(2024, 1, 1, tzinfo=timezone.utc)) == "manual__2024-01-01T00:00:00+00:00"
