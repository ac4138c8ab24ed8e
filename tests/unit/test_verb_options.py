"""One options dataclass per verb (issue 37, item 2): the CLI parses into it, the Airflow hook and
operators build the job's arguments from it (``to_argv``), and the two directions agree for the
values users give (paths with spaces, ``%``, non-ASCII, values starting with ``-``, lists); each
error class carries its exit status, which the CLI and the hook read; ``engines.run`` runs the
verbs with two engines. No Spark: the round trips are argument parsing, the runs in-process."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import spark_jobs
from spark_jobs import cli, exceptions
from spark_jobs.cli import build_parser, main
from spark_jobs.exceptions import BadInputError, BucketIndexError
from spark_jobs.table.action.alter import AlterOptions
from spark_jobs.table.action.bootstrap import BootstrapOptions
from spark_jobs.table.action.clean import CleanOptions
from spark_jobs.table.action.compact import CompactOptions
from spark_jobs.table.action.mirror import MirrorOptions
from spark_jobs.table.action.read import ReadOptions
from spark_jobs.table.action.rehash import RehashOptions
from spark_jobs.table.action.rollback import RollbackOptions
from spark_jobs.table.action.shadow_compare import ShadowCompareOptions
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.action.validate import ValidateOptions

pytestmark = pytest.mark.unit

#: a table and a source where users keep them: spaces, %, +, non-ASCII, an s3 URI with a query
TABLE = "/lake/ventes été/t 100%+1"
SOURCE = "s3://landing/2026-11-27/part %2F é/*.parquet"

CASES = [
    UpsertOptions(table=TABLE, source=SOURCE),
    UpsertOptions(table=TABLE, source=SOURCE, record_key=["région", "id"], precombine_field="ts",
                  partition_field="région", index="bucket", num_buckets=8, table_type="merge_on_read",
                  source_format="json", delete_field="is_deleted", batch_id="-2026-11-27%été",
                  target_file_rows=5000, max_retries=0, heartbeat_timeout_s=0.25, shadow_index="global_simple",
                  engine="arrow", memory_budget="512m", schema_evolution="add-columns,widen", partial_update=True,
                  mirror="delta"),
    ReadOptions(table=TABLE),
    ReadOptions(table=TABLE, as_of="2026-11-27T09:24:00+01:00", output="/out/snap été 1%.parquet", limit=0,
                engine="spark", memory_budget="4g"),
    ValidateOptions(table=TABLE),
    ValidateOptions(table=TABLE, engine="auto", memory_budget="1g"),
    ShadowCompareOptions(table=TABLE),
    ShadowCompareOptions(table=TABLE, against="bucket", since="20261127", sample_fraction=0.1, max_mismatches=7,
                         report="s3://reports/cmp été %.json", engine="arrow"),
    RollbackOptions(table=TABLE),
    RollbackOptions(table=TABLE, instant="20261127092400123", force=True, heartbeat_timeout_s=90.5),
    CompactOptions(table=TABLE),
    CompactOptions(table=TABLE, schedule_only=True, min_logs=2, log_ratio=0.3, max_groups=4, max_buckets=2, min_deltas=3,
                   delta_ratio=0.75, index_base_cap=1000, only="index", heartbeat_timeout_s=5.0, engine="arrow"),
    CompactOptions(table=TABLE, execute="20261127092400123"),
    CompactOptions(table=TABLE, rebuild_index=True, bucket=[0, 7, 15], index_base_cap=10),
    CleanOptions(table=TABLE),
    CleanOptions(table=TABLE, retain_hours=1.5, dry_run=True, heartbeat_timeout_s=30.0),
    AlterOptions(table=TABLE),
    AlterOptions(table=TABLE, add_columns=["remise été:decimal(10,2)", "-x:int"], widen_columns=["qty:bigint"],
                 max_retries=5),
    RehashOptions(table=TABLE, num_buckets=32),
    RehashOptions(table=TABLE, num_buckets=4, heartbeat_timeout_s=5),
    MirrorOptions(table=TABLE, enable="delta"),
    MirrorOptions(table=TABLE, repair=True),
    BootstrapOptions(table=TABLE, source="/warehouse/ventes été/2026 100%", record_key=["id"]),
    BootstrapOptions(table=TABLE, source="s3://landing/part %2F é", record_key=["région", "id"],
                     partition_field="région", precombine_field="mis à jour", index="bucket", mode="rewrite",
                     num_buckets=8, table_type="merge_on_read", engine="arrow", batch_id="-migration été 1%",
                     heartbeat_timeout_s=0.25, target_file_rows=5000, mirror="delta", memory_budget="512m"),
    BootstrapOptions(table=TABLE, source="/warehouse/t", record_key=["id"], index="global_simple", engine="spark",
                     batch_id="bootstrap-0123456789abcdef", heartbeat_timeout_s=120),
]


def _parse(opts: object) -> object:
    argv = [type(opts).VERB, *opts.to_argv()]  # type: ignore[attr-defined]
    return type(opts).from_args(build_parser().parse_args(argv))  # type: ignore[attr-defined]


@pytest.mark.parametrize("opts", CASES, ids=lambda o: f"{type(o).__name__}:{len(o.to_argv())}")
def test_the_cli_parses_back_the_options_to_argv_wrote(opts):
    assert _parse(opts) == opts


def test_every_verb_of_the_cli_but_show_has_an_options_class_in_the_round_trip():
    covered = {type(o).VERB for o in CASES}
    assert set(cli.COMMANDS) - covered == {"show"}
    # exported at the package root beside the other verbs' options
    assert "BootstrapOptions" in spark_jobs.__all__ and spark_jobs.BootstrapOptions is BootstrapOptions
    for cls in {type(o) for o in CASES}:
        params = inspect.signature(cls).parameters.values()
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), cls


def test_options_at_their_default_are_left_out_and_a_given_one_is_kept():
    assert UpsertOptions(table=TABLE, source=SOURCE).to_argv() == [TABLE, SOURCE]
    assert UpsertOptions(table=TABLE, source=SOURCE).to_argv(given=("source_format",)) == [
        TABLE, SOURCE, "--source-format", "parquet"]


@pytest.mark.parametrize("make,line", [
    (lambda: UpsertOptions(table="t", source="s", index="btree"), "--index must be one of record, bucket"),
    (lambda: UpsertOptions(table="t", source="s", max_retries=-1), "--max-retries must be 0 or more, got -1"),
    (lambda: UpsertOptions(table="t", source="s", heartbeat_timeout_s=0), "--heartbeat-timeout must be positive"),
    (lambda: UpsertOptions(table="t", source="s", engine="turbo"), "--engine must be one of auto, spark, arrow"),
    (lambda: ReadOptions(table="t", as_of="yesterday"), "--as-of"),
    (lambda: ShadowCompareOptions(table="t", sample_fraction=1.5), r"--sample-fraction must be in \(0, 1\]"),
    (lambda: RollbackOptions(table="t", instant="12x"), "INSTANT"),
    (lambda: CompactOptions(table="t", execute="20261127092400123", min_logs=2), "--execute runs a plan as"),
    (lambda: CompactOptions(table="t", bucket=[1]), "--bucket names the index buckets --rebuild-index"),
    (lambda: CompactOptions(table="t", rebuild_index=True, only="data"), "--only do not apply"),
    (lambda: CompactOptions(table="t", min_logs=0), "--min-logs must be at least 1"),
    (lambda: CleanOptions(table="t", retain_commits=2, retain_hours=1.0), "give one of them"),
    (lambda: AlterOptions(table="t", add_columns=["x"]), "--add-column"),
    (lambda: AlterOptions(table="t", max_retries=-2), "--max-retries must be 0 or more"),
    (lambda: RehashOptions(table="t", num_buckets=0), "--num-buckets must be at least 1"),
    (lambda: MirrorOptions(table="t"), r"one of --enable delta\|iceberg and --repair"),
    (lambda: BootstrapOptions(table="t", source="s", record_key=["id"], num_buckets=0),
     "--num-buckets must be at least 1, got 0"),
    (lambda: BootstrapOptions(table="t", source="s", record_key=["id"], heartbeat_timeout_s=-1.0),
     "--heartbeat-timeout must be positive"),
    (lambda: BootstrapOptions(table="t", source="s", record_key=["id"], index="bucket", mode="reference"),
     "the bucket index needs --mode rewrite"),
    (lambda: BootstrapOptions(table="t", source="s", record_key=["id"], index="global_simple", mode="reference"),
     "the global_simple index needs --mode rewrite"),
    (lambda: BootstrapOptions(table="t", source="s", record_key=["id"], index="btree"), "--index must be one of"),
    (lambda: BootstrapOptions(table="t", source="s", record_key=["id"], mode="copy"), "--mode must be one of"),
    (lambda: BootstrapOptions(table="t", source="s", record_key=[]), "--record-key must name at least one field"),
    (lambda: BootstrapOptions(table="t", source="s", record_key=["a.b"]), "record key field name 'a.b'"),
    (lambda: BootstrapOptions(table="t", source="s", record_key=["id"], engine="turbo"), "--engine must be one of"),
])
def test_options_are_validated_once_when_made_with_one_line(make, line):
    with pytest.raises(BadInputError, match=line) as info:
        make()
    assert "\n" not in str(info.value)


def test_the_hooks_upsert_arguments_reach_the_job_as_given():
    """A batch id that starts with ``-`` went to spark-submit as ``--batch-id -rerun...``, which
    the job's parser refused ("expected one argument", exit 2); now it parses back to the same options."""
    from airflow_provider_bucketindex.demo import sandbox

    sandbox.isolate_before_import()
    from airflow_provider_bucketindex.hooks.bucketindex import upsert_args

    args = upsert_args(TABLE, SOURCE, record_key=["région", "id"], partition_field="région", num_buckets="8",
                       batch_id="-rerun-2026-11-27%été", engine="spark", schema_evolution="all")
    parsed = UpsertOptions.from_args(build_parser().parse_args(["upsert", *args]))
    assert parsed == UpsertOptions(table=TABLE, source=SOURCE, record_key=["région", "id"], partition_field="région",
                                   num_buckets=8, batch_id="-rerun-2026-11-27%été", engine="spark",
                                   schema_evolution="all")


def test_the_operator_submits_the_options_it_would_run_in_the_task(tmp_path):
    from airflow_provider_bucketindex.demo import sandbox

    sandbox.isolate_before_import()
    from airflow_provider_bucketindex.operators import UpsertWithIndexOperator

    op = UpsertWithIndexOperator(task_id="u", table_uri=str(tmp_path / "t é 1%"), source_uri=SOURCE,
                                 record_key="région, id", precombine_field="ts", num_buckets="4",
                                 source_format="parquet", partial_update=True, schema_evolution="widen")
    in_task = op.upsert_options("b-1", table_exists=False)
    submitted = UpsertOptions.from_args(build_parser().parse_args(
        ["upsert", *op.build_args("b-1", table_exists=False)]))
    assert submitted == dataclasses.replace(in_task, engine="spark")
    assert "--source-format" in op.build_args("b-1", table_exists=False)  # given: written even at its default


def test_the_bootstrap_operator_submits_the_options_it_would_run_in_the_task(tmp_path):
    from airflow_provider_bucketindex.demo import sandbox

    sandbox.isolate_before_import()
    from airflow_provider_bucketindex.operators import BootstrapTableOperator

    op = BootstrapTableOperator(task_id="b", table_uri=str(tmp_path / "t é 1%"), source_uri="s3://landing/v é %2F",
                                record_key=" région , id ", partition_field="région", precombine_field="mis à jour",
                                index="bucket", num_buckets=" 8 ", table_type="merge_on_read",
                                heartbeat_timeout_s=2.5)
    in_task = op.options("-rerun été")
    submitted = BootstrapOptions.from_args(build_parser().parse_args(["bootstrap", *op.build_args("-rerun été")]))
    assert submitted == dataclasses.replace(in_task, engine="spark")
    assert submitted.record_key == ["région", "id"] and submitted.heartbeat_timeout_s == 2.5


def test_the_cli_refuses_bad_bootstrap_options_before_looking_at_the_source(tmp_path, capsys):
    """The options' checks come first: one line, exit 2, nothing created -- not "source does
    not exist", and no table directory."""
    table = tmp_path / "lake" / "t é"
    status = cli.main(["bootstrap", str(table), str(tmp_path / "absent"), "--record-key", " , ",
                       "--engine", "arrow"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "--record-key must name at least one field" in err and "\n" not in err
    assert not (tmp_path / "lake").exists()


# -- exit codes live on the exception classes ------------------------------------------------------
def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


OURS = [c for c in _subclasses(BucketIndexError) if c.__module__ == exceptions.__name__]


def _instance(cls: type) -> BaseException:
    if issubclass(cls, exceptions.IndexCorruptError):
        return cls("/t/.bucketindex/index/00003/base.arrow", table="/t", bucket=3, why="truncated")
    return cls(f"{cls.__name__} raised on purpose for /lake/t é")


def test_every_error_class_has_its_exit_status():
    assert {c.__name__ for c in OURS} | {"BucketIndexError"} == set(exceptions.__all__) - {"exit_code_of"}
    for cls in [BucketIndexError, *OURS]:
        assert cls.exit_code in (1, 2, 3), cls
        expected = 2 if issubclass(cls, BadInputError) else 3 if issubclass(cls, exceptions.RetryableError) else 1
        assert cls.exit_code == expected, cls
        assert exceptions.exit_code_of(_instance(cls)) == cls.exit_code
    assert exceptions.exit_code_of(ValueError("not ours")) is None


@pytest.mark.parametrize("cls", [BucketIndexError, *OURS], ids=lambda c: c.__name__)
def test_the_cli_exits_with_the_error_classs_status_and_one_line(cls, monkeypatch, capsys):
    def fail(args, submitted):  # type: ignore[no-untyped-def]
        raise _instance(cls)

    monkeypatch.setattr(cli, "_check_table", lambda args: None)
    monkeypatch.setitem(cli.COMMANDS, "validate", fail)
    assert cli.main(["validate", "/lake/t é"]) == cls.exit_code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bucketindex: ") and "raised on purpose" in err[0] or "index file" in err[0]


def test_an_error_class_with_its_own_status_is_obeyed(monkeypatch, capsys):
    """The CLI reads the class's ``exit_code``; it does not map a fixed list of branches."""

    class PlanGone(BucketIndexError):
        exit_code = 3

    monkeypatch.setattr(cli, "_check_table", lambda args: None)
    monkeypatch.setitem(cli.COMMANDS, "validate", lambda args, submitted: (_ for _ in ()).throw(PlanGone("gone")))
    assert cli.main(["validate", "/lake/t"]) == 3
    assert capsys.readouterr().err.strip() == "bucketindex: validate failed: gone"


def test_the_hook_reads_the_exit_statuses_from_the_classes():
    from airflow_provider_bucketindex.demo import sandbox

    sandbox.isolate_before_import()
    from airflow_provider_bucketindex.hooks import bucketindex as hook

    assert hook.EXIT_BAD_INPUT == BadInputError.exit_code == 2
    assert hook.EXIT_RETRYABLE == exceptions.RetryableError.exit_code == 3
    assert hook.EXIT_CHECK_FAILED == exceptions.TableCorruptError.exit_code == 1


# -- engines.run: one entry point for the verbs with two engines -----------------------------------
@pytest.fixture()
def table(tmp_path: Path) -> str:
    from spark_jobs.engines import run

    src = tmp_path / "lot 1 é%.parquet"
    pq.write_table(pa.table({"id": ["k 1/é%+", "k \"3\"", "k+2"], "ts": [1, 2, 3], "v": ["a", None, "c"]}), src)
    uri = str(tmp_path / "t é 100%")
    run("upsert", UpsertOptions(table=uri, source=str(src), record_key=["id"], precombine_field="ts",
                                num_buckets=2, engine="arrow"))
    return uri


def test_run_reads_validates_compares_and_compacts_in_process(table, tmp_path):
    from spark_jobs.engines import ReadResult, run

    def no_spark():  # type: ignore[no-untyped-def]
        raise AssertionError("auto started Spark for a three-row table")

    shown = run("read", ReadOptions(table=table, limit=2), spark=no_spark)
    assert isinstance(shown, ReadResult) and shown.engine == "arrow"
    assert "k 1/é%+" in (shown.text or "") and "only showing top 2 rows" in (shown.text or "")
    out = tmp_path / "snap é.parquet"
    written = run("read", ReadOptions(table=table, output=str(out)), spark=no_spark)
    assert written.rows == 3 and pq.read_table(out).num_rows == 3
    assert run("validate", ValidateOptions(table=table), spark=no_spark)["ok"]
    report = run("shadow-compare", ShadowCompareOptions(table=table), spark=no_spark)
    assert report["ok"] and report["keys_checked"] == 3
    assert run("compact", CompactOptions(table=table), spark=no_spark)["instant"] is None  # nothing due


def test_run_refuses_another_verbs_options_and_a_verb_with_one_engine(table):
    from spark_jobs.engines import run

    with pytest.raises(TypeError, match="ValidateOptions are the options of 'validate', not 'read'"):
        run("read", ValidateOptions(table=table))
    with pytest.raises(ValueError, match="not a verb with two engines"):
        run("clean", CleanOptions(table=table))


def test_the_cli_read_prints_what_run_returns(table, capsys):
    assert cli.main(["read", table, "--engine", "arrow", "--limit", "5"]) == 0
    text = capsys.readouterr().out
    assert "k 1/é%+" in text and "k+2" in text
    assert cli.main(["validate", table]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]


def test_a_shadow_index_equal_to_a_record_tables_index_is_refused_saying_why(tmp_path):
    """``shadow_index="record"`` from Python: the table's check names the reason (the tee would
    compare the index with itself), not only the list of shadow indexes; nothing is written."""
    import pyarrow as pa

    from spark_jobs.engines import precheck_upsert
    from spark_jobs.io import parquet

    src = tmp_path / "batch.parquet"
    parquet.write_table(pa.table({"id": ["a b", "ü"], "v": [1, 2]}), str(src))
    table = tmp_path / "t"
    main(["upsert", str(table), str(src), "--record-key", "id"])
    before = sorted(p.name for p in table.rglob("*"))
    with pytest.raises(BadInputError, match="compares the index with itself"):
        precheck_upsert(UpsertOptions(table=str(table), source=str(src), shadow_index="record"))
    with pytest.raises(BadInputError, match="--shadow-index must be one of global_simple, bucket, got 'hash'"):
        UpsertOptions(table=str(table), source=str(src), shadow_index="hash")
    assert sorted(p.name for p in table.rglob("*")) == before
