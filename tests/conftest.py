"""Test-wide environment: executors must run this interpreter (it has pyarrow); one local
Spark Connect server and one S3-compatible server per run, each started only if a test asks
for it; and the three tiers.

* the default run (``pytest``; ``addopts`` in setup.cfg says ``-m "not slow and not ci"``): the
  table protocol's oracle, crash, concurrency, equivalence and S3 tests on the in-process
  (Arrow) engine, and each Spark code path once (:data:`SPARK_PATHS`) -- the run people make
  between two changes;
* the CI tier (``pytest -m ci``, :data:`CI_TIER`): the rest of ``tests/spark`` (Spark twins of
  Arrow tests, the extended Spark matrix), the standalone cluster, Spark Connect, the end-to-end
  DAGs that run spark-submit, the Spark verb chains on S3, and more cases of Arrow scenarios whose
  first case stays;
* the release tier (``pytest -m slow``, :data:`EXTENDED`): the extended crash matrix -- more
  crash points and index or table types of scenarios the two other tiers run.

``.ci/run`` runs the default run, then the CI and release tiers together (``-m "ci or slow"``).

Every tier runs in pytest-xdist workers (``addopts``); :func:`pytest_xdist_make_scheduler` keeps
the tests that share a per-process resource in one worker, and :func:`pytest_configure` draws one
seed per run for what tests draw at collection.
"""

import os
import sys

import pytest



#: the environment variable holding the run's seed (:func:`pytest_configure`)
RUN_SEED_VAR = "BUCKETINDEX_TEST_RUN_SEED"


def pytest_configure(config):  # type: ignore[no-untyped-def]
    """Compile the packages (and the harness the subprocesses import) once per run.

    The tests start hundreds of cold processes (CLI runs, crash victims, racing writers, Spark's
    Python workers). Where ``PYTHONDONTWRITEBYTECODE`` is set (this VM and CI set it) and the
    checkout is fresh, none of them finds bytecode and each compiles every module it imports:
    about 0.13 s more per process. ``compileall`` writes the bytecode regardless of that setting
    (``__pycache__`` is git-ignored), as a first run would without it.
    """
    import compileall
    import random

    # One seed per run for what tests draw at collection (the torture test's random sequences):
    # pytest-xdist's workers inherit it and so collect the same test ids; set it to replay a run's.
    os.environ.setdefault(RUN_SEED_VAR, str(random.SystemRandom().randrange(2**31)))
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller compiled already
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for package in ("spark_jobs", "airflow_provider_bucketindex", os.path.join("tests", "harness")):
        compileall.compile_dir(os.path.join(root, package), quiet=2, workers=1)


os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# spark-submit from a pip-installed pyspark lives beside this interpreter
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


@pytest.fixture(scope="session")
def s3_server():  # type: ignore[no-untyped-def]
    """One counting S3-compatible server (moto, in its own process) on a free loopback port
    per run (:mod:`tests.harness.s3_server`)."""
    from tests.harness.s3_server import start_server

    server = start_server()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):  # type: ignore[no-untyped-def]
    """The server, reachable through this process's ``AWS_*`` environment (and so its children's:
    CLI subprocesses, Spark's Python workers), with no storage options left by another test."""
    from spark_jobs.io import storage

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("BUCKETINDEX_STORAGE_OPTIONS", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    storage.configure(None)
    yield s3_server
    storage.configure(None)


@pytest.fixture
def bucket(s3):  # type: ignore[no-untyped-def]
    """A new, empty bucket for this test: ``s3://<name>``."""
    import uuid

    name = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(name)
    return f"s3://{name}"


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A Spark Connect server on a free loopback port (``local[2]``: this machine has 2 cores).

    Its Python workers get ``spark_jobs`` only as each session's artifact: the server's
    environment has no PYTHONPATH pointing at this checkout.
    """
    from spark_jobs.jobs.connect import start_server

    log = tmp_path_factory.mktemp("connect-server") / "server.log"
    server = start_server(0, master="local[2]", conf={"spark.ui.enabled": "false"}, log_path=str(log))
    yield server
    server.stop()


#: The release tier (the extended crash matrix): more variations of a scenario whose default-tier
#: or CI-tier case already runs -- another index type, table type or crash point through the same
#: code path. They are marked ``slow``, left out of the default run and of ``.ci/run`` (it alone
#: took 17 to 37 minutes); run it with ``pytest -m slow`` before a release.
#: Each entry says which case stays in the default tier.
EXTENDED = {
    "tests/spark/test_index_compaction.py::test_index_compaction_beside_upserts_matches_the_oracle[copy_on_write]":
        "[merge_on_read] runs the same index compactions beside upserts (index compaction does not depend on "
        "the table type; its merge-on-read writers also append logs)",
    "tests/spark/test_bootstrap.py::test_killed_bootstrap_leaves_no_table_rows_and_the_next_run_finishes"
    "[reference-after_index_file]":
        "reference-before_complete kills the same bootstrap with every index delta written",
    "tests/spark/test_bootstrap.py::test_killed_bootstrap_leaves_no_table_rows_and_the_next_run_finishes"
    "[rewrite-after_data_file]":
        "a rewrite bootstrap is an upsert recorded as a bootstrap: the upsert crash tests cover its write path, "
        "reference-before_complete the bootstrap's recovery",
    "tests/spark/test_concurrent_writers.py::test_three_writers_overlapping_then_disjoint[record-merge_on_read]":
        "tests/unit/test_arrow_concurrent_writers.py runs the same rounds on Arrow for every index and table "
        "type, and test_arrow_writer_racing_a_spark_writer_matches_the_oracle has a Spark writer retry over "
        "an Arrow commit; this is the one case of three Spark writers",
    "tests/spark/test_concurrent_writers.py::test_forced_rollback_of_a_live_writer_never_leaves_a_broken_table"
    "[after_conflict_check-cli]": "after_index_file-operator",
    "tests/spark/test_retry_and_crash.py::test_killed_writer_leaves_old_snapshot_and_next_run_repairs"
    "[record-after_requested-rerun]": "record-after_data_file-rerun",
    "tests/spark/test_retry_and_crash.py::test_killed_writer_leaves_old_snapshot_and_next_run_repairs"
    "[record-before_complete-rerun]": "record-after_data_file-rerun and record-after_index_file-rollback",
    "tests/spark/test_retry_and_crash.py::test_killed_writer_leaves_old_snapshot_and_next_run_repairs"
    "[record-after_conflict_check-rerun]": "record-after_index_file-rollback; rehash's after_index_file",
    "tests/spark/test_index_compaction.py::test_upsert_and_index_compaction_overlap_in_two_processes[compaction]":
        "[upsert]: the same two processes, the other one held",
    "tests/spark/test_index_compaction.py::test_killed_while_scheduling_then_the_next_compact_folds_each_delta_once"
    "[schedule_after_requested]": "[schedule_after_plan]",
    "tests/spark/test_rehash.py::test_killed_rehash_leaves_old_or_new_layout_and_next_run_finishes"
    "[record-after_conflict_check]": "[bucket-after_data_file], [bucket-after_complete]",
    "tests/spark/test_rehash.py::test_killed_rehash_leaves_old_or_new_layout_and_next_run_finishes"
    "[record-after_index_file]": "[bucket-after_data_file], [bucket-after_complete]; the record split's "
                                 "tasks in the oracle test",
    "tests/spark/test_retry_and_crash.py::test_killed_writer_leaves_old_snapshot_and_next_run_repairs"
    "[bucket-after_data_file-rerun]": "record-after_data_file-rerun: the same commit protocol",
    "tests/spark/test_concurrent_writers.py::test_forced_rollback_of_a_live_writer_never_leaves_a_broken_table"
    "[after_data_file-cli]": "after_index_file-operator",
    "tests/spark/test_merge_on_read.py::test_killed_log_writer_leaves_old_snapshot_and_next_run_repairs"
    "[before_complete]": "tests/unit/test_arrow_merge_on_read.py kills the log writer at every point; "
                         "test_retry_and_crash's record-after_data_file-rerun kills a Spark writer in a task",
    # moved in session 32 to bring the default run back toward its budget: each is a Spark run of a
    # protocol scenario the Arrow tier and the torture test (tests/unit/test_torture.py) cover, beside
    # a Spark case that stays
    "tests/spark/test_merge_on_read.py::test_killed_log_writer_leaves_old_snapshot_and_next_run_repairs"
    "[after_data_file]": "tests/unit/test_arrow_merge_on_read.py kills the log writer at every point; "
                         "test_retry_and_crash's record-after_data_file-rerun kills a Spark writer in a task",
    "tests/spark/test_retry_and_crash.py::test_killed_writer_leaves_old_snapshot_and_next_run_repairs"
    "[record-after_index_file-rollback]": "record-after_data_file-rerun (a Spark writer killed in a task); "
                                          "tests/unit/test_arrow_retry_and_crash.py repairs by rollback at "
                                          "every point",
    "tests/spark/test_index_compaction.py::test_killed_index_compaction_leaves_the_snapshot_and_resumes":
        "tests/unit/test_arrow_compact.py kills a compaction (index and data) at every point; "
        "tests/spark/test_merge_on_read.py kills a Spark compaction",
    "tests/spark/test_concurrent_writers.py::test_arrow_writer_racing_a_spark_writer_matches_the_oracle":
        "test_forced_rollback_of_a_live_writer_never_leaves_a_broken_table[after_index_file-operator] races a "
        "Spark writer; tests/unit/test_arrow_concurrent_writers.py and the torture test's racing writers run "
        "the commit protocol",
    "tests/spark/test_engine_equivalence.py::test_same_batches_same_table[global_simple-copy_on_write]":
        "[global_simple-merge_on_read], [record-copy_on_write], [bucket-merge_on_read]: each index type and "
        "table type once",
    "tests/spark/test_engine_equivalence.py::test_same_batches_same_table[record-merge_on_read]":
        "[record-copy_on_write], [global_simple-merge_on_read]",
    "tests/spark/test_engine_equivalence.py::test_same_batches_same_table[bucket-copy_on_write]":
        "[bucket-merge_on_read], [record-copy_on_write]",
    "tests/connect/test_connect_jobs.py::test_killed_writer_leaves_old_snapshot_and_next_run_repairs"
    "[record-after_index_file-rollback]": "[record-after_data_file-rerun] and [bucket-after_data_file-rerun] "
                                          "kill a writer over Connect; tests/spark runs the same points locally",
    "tests/connect/test_connect_jobs.py::test_killed_writer_leaves_old_snapshot_and_next_run_repairs"
    "[record-before_complete-rerun]": "[record-after_data_file-rerun] over Connect",
}


_SHADOW_TWIN = ("the same-named test of tests/unit/test_arrow_shadow_compare.py plants the same fault on Arrow; "
                "tests/spark/test_shadow_compare_engines.py holds the Spark job's report equal to Arrow's on damaged "
                "tables; the Spark-only cases of the file (odd partitions, --since after a delete, a compaction "
                "and a clean) stay")

#: The CI tier: left out of the default run, run by ``.ci/run`` after it (``pytest -m ci``). A key
#: is a directory (``tests/connect/``), a file or a test id; each says which default-run test
#: keeps the code path it exercises (or why none needs to).
CI_TIER = {
    "tests/spark/":
        "Spark twins of the Arrow engine's tests (the same scenario, the oracle, the equivalence) and the "
        "extended Spark matrix; every Spark code path stays in the default run through SPARK_PATHS",
    "tests/s3/test_verbs_spark_s3.py":
        "Spark verb chains on S3 (JVM work); the Spark S3 read path stays through SPARK_PATHS, the verbs on S3 "
        "through tests/s3/test_verbs_arrow_s3.py",
    "tests/s3/test_uri_secrets_s3.py::test_arrow_verbs_keep_uri_secrets":
        "every Arrow verb as a cold process on an S3 URI with a query string: tests/unit/test_uri_redaction.py "
        "redacts every verb's URI in-process; test_a_derived_batch_id_reads_the_file_a_uri_with_a_query_names stays",
    "tests/s3/test_verbs_arrow_s3.py::test_arrow_verbs_on_an_s3_table_with_an_s3_source[copy_on_write]":
        "[merge_on_read]: the same verbs on S3 with logs and a compaction",
    **{f"tests/unit/test_arrow_auto_compact.py::test_killed_automatic_index_fold_leaves_the_upsert_committed_and_is_"
       f"finished_next[compact-{p}]":
       "[upsert-" + p + "]: the same kill of an automatic index fold, finished by the next upsert; a killed "
       "automatic plan finished by `compact` stays through test_killed_automatic_compaction_leaves_the_upsert_"
       "committed_and_is_finished_next[compact-*]"
       for p in ("schedule_after_requested", "auto_compact_before_commit")},
    "tests/unit/test_scale_benchmark.py": "benchmarks/scale.py end to end at 2k rows: a test of a benchmark script "
                                          "(its oracle and resumption), not of the product",
    "tests/unit/test_index_scale_benchmark.py": "benchmarks/index_scale.py at 3 buckets: a test of a benchmark "
                                                "script, not of the product",
    "tests/s3/test_torture_s3.py":
        "a torture sequence on the moto S3 server in the Delta fresh view (130 s on 2 shared cores: every "
        "step reads every retained Delta version from S3 through two readers): the same checks run on local "
        "disk in tests/unit/test_torture.py (test_the_delta_fresh_view_of_a_partitioned_table_matches_the_oracle), "
        "and the Delta fresh view's reads on S3 in tests/unit/test_delta_fresh.py",
    "tests/s3/test_request_budget.py::test_upsert_costs_the_same_after_a_long_history_and_what_the_budget_says":
        "a long history built on S3 (checkpoints and archival twice): tests/unit/test_timeline_services.py's "
        "test_opening_cost_does_not_grow_with_history holds the same on local disk; the request budget's other "
        "tests stay",
    **{f"tests/spark/test_bad_input.py::test_bad_batch_is_rejected_and_nothing_written[{c}]":
       "[null key], [uncastable type], [missing column] keep the Spark job's refusals with nothing written; the "
       "rest are the config and schema checks both engines share (tests/unit/test_cli_newcomer.py refuses them "
       "from metadata, tests/unit/test_table_format.py checks each contradiction)"
       for c in ("missing key column", "empty key", "index type contradicts", "bucket count contradicts",
                 "key fields contradict", "partition field contradicts", "new column", "missing precombine",
                 "missing column, not every row deletes")},
    "tests/connect/":
        "Spark Connect: the same jobs as tests/spark over a local Connect server (a second JVM per run); "
        "tests/unit/test_provider_connect.py builds the Connect commands",
    "tests/cluster/":
        "a standalone master and worker (two more JVMs) running the ingest DAG through spark-submit, and a "
        "durable upsert whose task process is killed mid-job (tests/spark/test_durable_submit.py: local mode; "
        "tests/unit/test_provider_durable.py: a stand-in spark-submit in the default run)",
    # end-to-end DAGs that run spark-submit: the operator's spark-submit path stays in the default
    # run through tests/airflow/test_ingest_e2e.py (its killed writer is a real spark-submit), the
    # DAGs' in-task Arrow path through test_engine_e2e.py and test_s3_ingest_e2e.py
    "tests/airflow/test_connect_e2e.py": "the ingest DAG over Spark Connect (see tests/connect/)",
    "tests/airflow/test_mapped_e2e.py":
        "mapped upserts through spark-submit, one killed: test_ingest_e2e.py's killed writer and its "
        "rollback branch, tests/unit/test_provider_operators.py's map-index rollback",
    "tests/airflow/test_nightly_e2e.py::test_nightly_run_compacts_beside_a_concurrent_upsert_cleans_and_validates":
        "the nightly DAG's services through spark-submit: tests/spark/test_merge_on_read.py and "
        "test_index_compaction.py compact on Spark beside upserts; test_nothing_due_skips_the_services_and_the_run_"
        "succeeds and test_deferred_sensor_resumes_through_its_trigger run the DAG's own logic",
    "tests/airflow/test_nightly_e2e.py::test_failed_execute_cancels_the_compaction_and_fails_the_run":
        "the nightly DAG's failure branch after a real spark-submit compaction (its table is the test above's)",
    "tests/airflow/test_rehash_dag.py::test_triggered_rehash_waits_rehashes_and_validates":
        "the rehash DAG through spark-submit: tests/spark/test_rehash.py rehashes on Spark; "
        "test_params_are_validated_by_the_trigger_form stays",
    "tests/airflow/test_rehash_dag.py::test_a_bad_count_fails_the_task_before_any_spark_job":
        "needs the module's table, made by two cold CLI upserts; tests/unit/test_provider_rehash.py refuses "
        "bad counts",
    "tests/airflow/test_shadow_compare_dag.py":
        "the shadow-compare DAG through spark-submit: tests/spark/test_shadow_compare.py and "
        "tests/unit/test_arrow_shadow_compare.py find the same faults, tests/unit/test_provider_shadow_compare.py "
        "covers the operator",
    # Spark twins: the scenario stays in the default run on the Arrow engine, and the Spark code
    # path it drives stays there through the case named
    "tests/spark/test_concurrent_writers.py::test_forced_rollback_of_a_live_writer_never_leaves_a_broken_table"
    "[after_index_file-operator]":
        "tests/unit/test_arrow_concurrent_writers.py runs the same body on Arrow at every point; "
        "tests/spark/test_conflict_reads_spark.py keeps a Spark writer losing a race and retrying",
    "tests/spark/test_lean_job.py::test_cold_cli_merge_of_an_unpartitioned_table_runs_in_several_tasks":
        "a cold CLI upsert of 400k rows, for the merge's task count: the job-count tests of the same file "
        "keep the Spark upsert's phases; tests/spark/test_retry_and_crash.py runs a cold CLI Spark upsert",
    "tests/spark/test_engine_equivalence.py::test_engines_alternating_on_one_table_match_oracle[bucket]":
        "[record]; test_same_batches_same_table[bucket-merge_on_read] runs the bucket index on both engines",
    "tests/spark/test_validate.py::test_engines_give_the_same_report[record-merge_on_read]":
        "[record-copy_on_write], [bucket-merge_on_read]: each index type and table type once",
    "tests/spark/test_validate.py::test_engines_give_the_same_report[bucket-copy_on_write]":
        "[bucket-merge_on_read], [record-copy_on_write]",
    "tests/spark/test_validate.py::test_engines_give_the_same_report[global_simple-merge_on_read]":
        "[global_simple-copy_on_write], [bucket-merge_on_read]",
    "tests/spark/test_merge_on_read.py::test_logs_not_rewrites_and_every_reader_merges_them[bucket]":
        "[record], [global_simple]; tests/unit/test_arrow_merge_on_read.py on every index type; "
        "tests/spark/test_engine_equivalence.py's [bucket-merge_on_read]",
    "tests/s3/test_uri_secrets_s3.py::test_spark_verbs_keep_uri_secrets":
        "every Spark verb as a cold CLI process on S3 (one JVM each): test_arrow_verbs_keep_uri_secrets "
        "runs every verb through the same redaction (io.storage.redact_uri); tests/unit/test_uri_redaction.py",
    "tests/spark/test_shadow_compare.py::test_index_entry_pointing_at_the_wrong_file_group": _SHADOW_TWIN,
    "tests/spark/test_shadow_compare.py::test_index_entry_in_another_partition_is_a_wrong_location_also_against_bucket": _SHADOW_TWIN,
    "tests/spark/test_shadow_compare.py::test_missing_index_entry": _SHADOW_TWIN,
    "tests/spark/test_shadow_compare.py::test_extra_entry_for_a_deleted_key": _SHADOW_TWIN,
    "tests/spark/test_shadow_compare.py::test_duplicated_key_in_the_data": _SHADOW_TWIN,
    "tests/spark/test_shadow_compare.py::test_bucket_table_row_in_the_wrong_bucket": _SHADOW_TWIN,
    "tests/spark/test_shadow_compare.py::test_since_compares_only_keys_touched_after_the_instant": _SHADOW_TWIN,
    "tests/spark/test_shadow_compare.py::test_sample_fraction_is_deterministic": _SHADOW_TWIN,
    "tests/spark/test_validate.py::test_cli_validate_exits_1_on_mismatch":
        "a cold CLI process for validate's exit 1: the same report in-process in test_key_missing_from_index; "
        "the CLI's exit 1 for validate's findings in tests/unit/test_arrow_read_validate.py",
    # More cases of Arrow-engine scenarios whose first case stays in the default run (moved in
    # session 43 to bring the default run under its 12 minutes): the same code path with another
    # option, crash point, table type or refused column shape
    **{f"tests/unit/test_cli_newcomer.py::test_a_metadata_only_refusal_answers_in_under_2s_without_a_jvm[{o}]":
       "[--record-key]: the same cold process refusing a contradiction with the table's config from metadata "
       "([--num-buckets], [--delete-field] and [--extra-column] stay for the other checks); "
       "tests/unit/test_table_format.py::test_config_round_trip_and_conflicts checks each field's contradiction"
       for o in ("--index", "--table-type", "--precombine-field", "--partition-field")},
    **{f"tests/unit/test_arrow_concurrent_writers.py::test_three_writers_overlapping_then_disjoint[{c}]":
       "[record-merge_on_read]: the same three processes racing on the Arrow engine; the torture test's racing "
       "writers draw every index and table type"
       for c in ("record-copy_on_write", "bucket-copy_on_write")},
    **{f"tests/unit/test_arrow_concurrent_writers.py::test_forced_rollback_of_a_live_writer_never_leaves_a_broken_table"
       f"[{c}]": "[after_index_file-operator]: a live writer paused at a point and rolled back by force; "
                 "test_commit_protocol_stress races eight writers through every point of the protocol"
       for c in ("after_requested-cli", "after_data_file-cli", "after_conflict_check-cli")},
    "tests/unit/test_arrow_memory.py::test_engine_arrow_refuses_work_over_the_budget_the_user_set[environment]":
        "[option]: the same refusal with the budget given as --memory-budget (both reach "
        "table.action.engine.memory_budget; tests/unit/test_provider_engine.py reads the environment's)",
    **{f"tests/unit/test_column_kind_change.py::test_a_change_of_shape_is_refused_in_one_line_before_a_jvm[{c}]":
       "[tags-string-auto] and [s-array<bigint>-spark]: the same refusal from the batch's schema, before a JVM, "
       "on each engine choice"
       for c in ("tags-string-spark-add-columns", "n-array<int>-auto", "n-array<int>-auto-all",
                 "s-struct<a:bigint,b:string>-auto", "deep-array<array<int>>-arrow")},
    **{f"tests/unit/test_first_day_papercuts.py::test_a_delete_flag_without_delete_field_is_refused_naming_delete_field_"
       f"first[{c}]": "[is_deleted-kind0-values0]: the same refusal naming --delete-field for another column name"
       for c in ("__deleted-kind1-values1", "gone-kind2-values2")},
}


#: The Spark code paths the default run keeps: CI_TIER moves every test of ``tests/spark/`` (and
#: the Spark files of ``tests/s3``) to the CI tier but these -- each Spark job, reader and rule once,
#: held to the Arrow engine or the oracle, on data like users', and the tests there that start no
#: Spark at all. Each says the code path it holds. A Spark writer losing a race and deciding again
#: (tests/spark/test_conflict_reads_spark.py) is in the CI tier: the same races run on Arrow in
#: tests/unit/test_conflict_reads.py, and the rule that decides what a retry redoes is the core's
#: (table/action/conflict.py).
#: The Airflow operators' spark-submit path (a writer killed in a real spark-submit, rolled back)
#: stays through tests/airflow/test_ingest_e2e.py.
SPARK_PATHS: dict[str, str] = {
    "tests/spark/test_engine_equivalence.py::test_same_batches_same_table[bucket-merge_on_read]":
        "the Spark upsert (jobs/upsert.py) writing merge-on-read logs through the bucket index: equal to the Arrow "
        "engine and the oracle at every instant over odd keys, moves, deletes, stale rows and ties",
    "tests/spark/test_lean_job.py::test_spark_jobs_per_upsert_and_validate[global_simple]":
        "the global_simple index's Spark join (the table's keys broadcast) and validate's jobs",
    "tests/spark/test_retry_and_crash.py::test_same_batch_id_twice_is_one_commit":
        "the Spark upsert, copy-on-write through the record index, and its batch-id idempotence (a rerun is "
        "one commit)",
    "tests/spark/test_rehash_engines.py::test_spark_and_arrow_rehash_give_the_same_table[bucket-merge_on_read]":
        "the Spark rehash (jobs/rehash.py) equal to the Arrow rehash",
    "tests/spark/test_bootstrap_equivalence.py::test_both_engines_bootstrap_the_same_table[reference-record]":
        "the Spark bootstrap, reference mode, equal to Arrow's",
    "tests/spark/test_bootstrap_equivalence.py::test_both_engines_bootstrap_the_same_table[rewrite-bucket]":
        "the Spark bootstrap, rewrite mode (the upsert job), equal to Arrow's",
    "tests/spark/test_compact_engines.py::test_spark_and_arrow_compaction_give_the_same_table":
        "the Spark compaction (jobs/compact.py) equal to Arrow's",
    "tests/spark/test_auto_compact_spark.py::test_spark_upserts_compact_automatically_as_arrow_upserts_do":
        "a Spark upsert's automatic compaction (jobs/compact.py auto_pick), the same layout as Arrow's",
    "tests/spark/test_validate.py::test_engines_give_the_same_report[bucket-merge_on_read]":
        "the Spark validate (jobs/validate.py) giving Arrow's report",
    "tests/spark/test_shadow_compare_engines.py::test_both_engines_report_the_same_on_damaged_tables"
    "[record-copy_on_write]": "the Spark shadow-compare (jobs/shadow_compare.py) on damaged tables, as Arrow's",
    "tests/spark/test_shadow_tee.py::test_arrow_tee_equals_spark_tee[record-bucket-True]":
        "the Spark upsert's shadow tee, as the Arrow tee",
    "tests/spark/test_datasource.py::test_spark_reads_the_snapshot_as_of_through_sql_with_pruning[merge_on_read]":
        "the Spark data source (spark.read.format('bucketindex'), SQL, as-of, pruning; jobs/datasource.py) merging "
        "logs",
    "tests/spark/test_datasource.py::test_options_are_checked": "the data source's options refused in one line",
    "tests/spark/test_arrow_source.py::test_json_batch_into_a_table_equals_spark":
        "Spark's JSON source reader (jobs/source.py) as the Arrow engine reads it",
    "tests/spark/test_arrow_source.py::test_parquet_directory_read_as_spark_reads_it":
        "Spark's Parquet directory reader as the Arrow engine reads it",
    "tests/spark/test_arrow_source.py::test_uncastable_values_fail_with_the_spark_line":
        "Spark's cast rules (try_cast) and their error line, as the Arrow engine words them",
    "tests/spark/test_keys.py": "Spark's key, bucket (xxhash64) and partition-directory expressions equal Python's",
    "tests/spark/test_bad_input.py::test_bad_batch_is_rejected_and_nothing_written":
        "bad batches refused on the Spark path with nothing written",
    "tests/spark/test_bad_input.py::test_cli_exit_2_with_one_line": "the Spark path's one-line exit 2",
    "tests/spark/test_bad_input.py::test_cli_refuses_missing_column_before_spark": "refused before a JVM",
    "tests/spark/test_bad_input.py::test_cli_usage_error_exits_2": "usage errors, exit 2",
    "tests/spark/test_bad_input.py::test_empty_batch": "an empty batch on the Spark path",
    "tests/spark/test_bad_input.py::test_missing_source_path": "a missing source on the Spark path",
    "tests/spark/test_bad_input.py::test_new_table_not_created_on_bad_input": "no table left by a refused first batch",
    "tests/spark/test_path_safety.py::test_bad_field_names_are_refused_before_anything":
        "field names that would leave the table root, refused from metadata",
    "tests/spark/test_path_safety.py::test_cli_refuses_an_absolute_partition_field_before_the_jvm":
        "an absolute partition field refused before a JVM",
    "tests/spark/test_timestamps.py::test_nanosecond_timestamps_are_refused_before_spark":
        "nanosecond timestamps refused before a JVM",
    "tests/s3/test_verbs_spark_s3.py::test_glob_and_hive_source_read_as_spark_reads_them":
        "Spark tasks reading S3 sources through pyarrow (jobs/hadoop_fs.py; no S3 connector in the JVM)",
    "tests/s3/test_verbs_spark_s3.py::test_spark_session_has_no_s3_connector":
        "the premise of the S3 Spark path: the JVM has no S3 connector",
    # tests of tests/spark/ that start no Spark (no session, no JVM): the core's and the CLI's
    "tests/spark/test_path_safety.py::test_layout_and_fileio_refuse_paths_outside_the_root":
        "starts no Spark: the layout and FileIO refuse paths outside the table root",
    "tests/spark/test_path_safety.py::test_clean_and_rollback_never_delete_outside_the_root":
        "starts no Spark: clean and rollback never delete outside the root",
    "tests/spark/test_path_safety.py::test_delete_treats_a_name_too_long_as_absent":
        "starts no Spark: a delete of a name too long is a delete of an absent key",
    "tests/spark/test_precombine_order_spark.py::test_bootstrap_keeps_the_duplicate_with_the_highest_value_in_section_8s_order":
        "starts no Spark: the bootstrap kernel's precombine order (NaN, -0.0, null), called directly",
    "tests/spark/test_lean_job.py::test_resource_failure_is_one_line_exit_1":
        "starts no Spark: the CLI's one line for a JVM out-of-memory error",
    "tests/spark/test_torture_spark.py::test_the_spark_seeds_cover_both_bootstraps_and_both_directions":
        "starts no Spark: the generator's Spark seeds cover both bootstrap modes and both rehash directions",
}


def _tier_key(nodeid: str, table: dict[str, str]) -> str | None:
    """The key of ``table`` naming ``nodeid``: itself, its function (every parameter), its file or a
    directory above it."""
    if nodeid in table:
        return nodeid
    function = nodeid.split("[")[0]
    if function in table:
        return function
    path = nodeid.split("::")[0]
    if path in table:
        return path
    return next((k for k in table if k.endswith("/") and path.startswith(k)), None)


#: Tests that share a per-process resource run in one pytest-xdist worker: the local Spark
#: session (a JVM per worker would put two JVMs on 2 cores) and the private Airflow whose SQLite DB
#: each process migrates once -- with the tests that start a JVM of their own and need that DB or
#: the one Connect server (the standalone cluster runs the ingest DAG; tests/connect and the
#: Connect DAG share the server, so it starts once). Every other test is scheduled on its own.
_SHARED = (
    ("spark", ("tests/spark/", "tests/s3/test_verbs_spark_s3.py")),
    ("airflow", ("tests/airflow/", "tests/cluster/", "tests/connect/")),
)

#: The release tier's tests of the local Spark session (:data:`EXTENDED`) run in a worker and a
#: session of their own: ``.ci/run`` runs them beside the CI tier (``-m "ci or slow" -n 3``), where
#: the Spark worker is the critical path and the others would sit idle behind it.
_SPARK_RELEASE = "spark-release"


def _xdist_scope(nodeid: str) -> str:
    """The unit pytest-xdist hands a worker: a shared group's name, else the test itself."""
    for group, prefixes in _SHARED:
        if nodeid.startswith(prefixes):
            return _SPARK_RELEASE if group == "spark" and nodeid in EXTENDED else group
    return nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):  # type: ignore[no-untyped-def]
    """``--dist loadgroup`` with ``xdist_group`` marks would do this, but pytest 9.2 no longer lets
    pytest-xdist 3.8 rename the node ids it groups by (pytest-xdist issue #1386); a scope of our
    own gives the same schedule."""
    from xdist.scheduler import LoadScopeScheduling

    class _SharedResourceScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _xdist_scope(nodeid)

    return _SharedResourceScheduling(config, log)


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    both = sorted(set(CI_TIER) & set(SPARK_PATHS))
    if both:
        raise pytest.UsageError(f"tests/conftest.py names these in both CI_TIER and SPARK_PATHS: {both}")
    seen = set()
    for item in items:
        if item.nodeid in EXTENDED:
            item.add_marker(pytest.mark.slow)
            seen.add(item.nodeid)
        kept = _tier_key(item.nodeid, SPARK_PATHS)
        if kept is not None:
            seen.add(kept)
        key = _tier_key(item.nodeid, CI_TIER)
        if key is not None:
            seen.add(key)
            # one tier each: the release tier keeps its own; a Spark path the default run keeps
            # stays there unless CI_TIER names the test itself
            if item.get_closest_marker("slow") is None and (kept is None or key == item.nodeid):
                item.add_marker(pytest.mark.ci)
    # a test of the shared Spark session outside the Spark workers' paths would start one more
    # JVM in another worker: name its file in _SHARED (tests/connect's ``spark`` is a session of
    # the one Connect server, a JVM of its own either way)
    strays = [item.nodeid for item in items if "spark" in getattr(item, "fixturenames", ())
              and _xdist_scope(item.nodeid) not in ("spark", _SPARK_RELEASE)
              and not item.nodeid.startswith("tests/connect/")]
    if strays:
        raise pytest.UsageError(f"tests/conftest.py: these tests use the Spark session but _SHARED's 'spark' group "
                                f"does not name their files: {strays}")
    # a renamed test, file or parameter must not fall out of every tier unnoticed
    files = {item.nodeid.split("::")[0] for item in items}
    stale = [n for n in [*EXTENDED, *CI_TIER, *SPARK_PATHS] if n.split("::")[0] in files and n not in seen]
    if stale and not config.getoption("keyword") and all("::" not in a for a in config.args):
        raise pytest.UsageError(f"tests/conftest.py EXTENDED, CI_TIER or SPARK_PATHS names tests that do not exist: "
                                f"{stale}")


def pytest_report_header(config):  # type: ignore[no-untyped-def]
    return f"bucketindex: run seed {os.environ.get(RUN_SEED_VAR)} (replay what it drew with {RUN_SEED_VAR}=<seed>)"
