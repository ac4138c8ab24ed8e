"""IndexShadowCompareOperator and IndexMismatchNotifier: conventions, the command built (the
hook's submit is replaced only to see the arguments and to play the job's outcome: a report
file written, an exit status), how outcomes map to failures, the notifier's message and its
hand-off to other notifiers and callables."""

from __future__ import annotations

import json

import pytest

from airflow_provider_bucketindex.demo import sandbox

pytestmark = pytest.mark.unit

REPORT = {"table": "/lake/t", "index_type": "record", "instant": "20250301100000000", "against": "scan",
          "since": None, "sample_fraction": 1.0, "commits_since": None, "since_files_gone": None,
          "keys_checked": 120, "missing": 0, "wrong_location": 0, "extra": 0, "duplicated": 0, "mismatches": 0,
          "max_mismatches": 0, "ok": True, "samples": {}, "elapsed_ms": 900}


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex import operators

    return operators


@pytest.fixture
def job(monkeypatch):  # type: ignore[no-untyped-def]
    """Plays the job: records (verb, args), writes ``report`` to --report, exits ``rc``."""
    from airflow_provider_bucketindex.hooks import bucketindex

    monkeypatch.delenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", raising=False)
    state = {"calls": [], "report": None, "rc": 0}

    def submit(self, verb, args, **kw):  # type: ignore[no-untyped-def]
        args = list(args)
        state["calls"].append((verb, args))
        if state["report"] is not None:
            path = args[args.index("--report") + 1]
            import pathlib

            pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
            pathlib.Path(path).write_text(json.dumps(state["report"]))
        if state["rc"]:
            raise bucketindex.SparkJobFailed(verb, state["rc"], "shadow-compare failed")

    monkeypatch.setattr(bucketindex.BucketIndexHook, "submit", submit)
    return state


def _mismatch(**counts):  # type: ignore[no-untyped-def]
    r = dict(REPORT, **counts)
    r["mismatches"] = sum(r[k] for k in ("missing", "wrong_location", "extra", "duplicated"))
    r["ok"] = r["mismatches"] <= r["max_mismatches"]
    r["samples"] = {k: [f"key-{k}-{i}" + "x" * 300 for i in range(10)] for k in counts if counts[k]}
    return r


class _TI:
    #: the real task instance's metric tags (ResumableJobMixin reads them)
    stats_tags: dict[str, str] = {}

    def __init__(self, xcom=None, task_id="shadow_compare", dag_id="d", map_index=-1):  # type: ignore[no-untyped-def]
        self.task_id, self.dag_id, self.map_index = task_id, dag_id, map_index
        self.pushed, self.xcom = {}, dict(xcom or {})

    def xcom_push(self, key, value):  # type: ignore[no-untyped-def]
        self.pushed[key] = value

    def xcom_pull(self, task_ids=None, key="return_value", **kw):  # type: ignore[no-untyped-def]
        return self.xcom.get(key)


def _ctx(ti=None, run_id="scheduled__2025-03-01T10:00:00+00:00"):  # type: ignore[no-untyped-def]
    return {"ti": ti or _TI(), "run_id": run_id}


def test_conventions_and_registration(ops):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_bucketindex import get_provider_info
    from airflow_provider_bucketindex.operators.shadow_compare import IndexMismatchError

    with pytest.raises(TypeError):
        ops.IndexShadowCompareOperator("s", "/t")  # type: ignore[misc]
    kw = dict(table_uri="{{ params.table_uri }}", since="{{ prev }}", sample_fraction="{{ params.f }}",
              against="{{ params.against }}", max_mismatches="{{ params.n }}", report_uri="{{ r }}",
              reports_dir="{{ d }}", master="local[2]", conf={"k": "{{ ds }}"}, name="n", env_vars={"E": "1"},
              storage_conn_id="{{ params.store }}",
              storage_options={"region": "{{ params.region }}"})
    op = ops.IndexShadowCompareOperator(task_id="s", **kw)
    assert set(op.template_fields) == set(kw)
    assert all(getattr(op, f) == kw[f] for f in op.template_fields)  # assigned verbatim
    assert "hook" not in vars(op)  # nothing built in __init__
    assert issubclass(IndexMismatchError, AirflowFailException)
    info = get_provider_info()
    assert "airflow_provider_bucketindex.operators.shadow_compare" in info["operators"][0]["python-modules"]
    assert "airflow_provider_bucketindex.notifications.shadow_compare.IndexMismatchNotifier" in info["notifications"]


def test_the_command_built(ops, job, tmp_path):  # type: ignore[no-untyped-def]
    table = str(tmp_path / "lake" / "ventes été")
    op = ops.IndexShadowCompareOperator(task_id="s", table_uri=table, since=" 20250301100000000 ",
                                        sample_fraction="0.25", against="bucket", max_mismatches="3",
                                        master="local[2]")
    cmd = op.spark_submit_command(_ctx())
    report = f"{tmp_path}/lake/_bucketindex_reports/ventes_été/d/scheduled__2025-03-01T10_00_00_00_00/s.json"
    expected = [table, "--against", "bucket", "--since", "20250301100000000", "--sample-fraction", "0.25",
                "--max-mismatches", "3", "--report", report]
    assert cmd[-len(expected) - 1:] == ["shadow-compare", *expected]
    job["report"] = REPORT
    op.execute(_ctx())
    assert job["calls"] == [("shadow-compare", expected)]
    # templates left empty (first run: no since; all keys): no option at all; a report_uri wins
    op = ops.IndexShadowCompareOperator(task_id="s", table_uri=table, since="", sample_fraction="1.0",
                                        max_mismatches=None, report_uri=str(tmp_path / "r.json"))
    op.execute(_ctx())
    assert job["calls"][-1] == ("shadow-compare", [table, "--against", "scan", "--max-mismatches", "0",
                                                   "--report", str(tmp_path / "r.json")])
    op = ops.IndexShadowCompareOperator(task_id="s", table_uri=table, reports_dir=str(tmp_path / "rep"))
    op.execute(_ctx(_TI(map_index=2)))
    assert job["calls"][-1][1][-1] == f"{tmp_path}/rep/d/scheduled__2025-03-01T10_00_00_00_00/s-2.json"


@pytest.mark.parametrize("field,value,message", [
    ("sample_fraction", "half", "sample_fraction must be a number"),
    ("sample_fraction", "1.5", r"sample_fraction must be in \(0, 1\]"),
    ("max_mismatches", "-1", "max_mismatches must be at least 0"),
])
def test_bad_options_fail_without_a_job(ops, job, tmp_path, field, value, message):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    op = ops.IndexShadowCompareOperator(task_id="s", table_uri=str(tmp_path / "t"), **{field: value})
    with pytest.raises(AirflowFailException, match=message):
        op.execute(_ctx())
    assert job["calls"] == []


def test_success_returns_a_small_summary_and_lineage(ops, job, tmp_path):  # type: ignore[no-untyped-def]
    table = str(tmp_path / "t")
    job["report"] = dict(REPORT, table=table)
    op = ops.IndexShadowCompareOperator(task_id="s", table_uri=table, report_uri=str(tmp_path / "r.json"))
    ti = _TI()
    out = op.execute(_ctx(ti))
    assert out["ok"] is True and out["instant"] == REPORT["instant"] and out["keys_checked"] == 120
    assert out["report_uri"] == str(tmp_path / "r.json") and out["table_uri"] == table and out["samples"] == {}
    assert ti.pushed == {}
    lineage = op.get_openlineage_facets_on_complete(None)
    assert [d.name for d in lineage.inputs] == [table] and lineage.outputs == []


@pytest.mark.parametrize("xcom", [True, False])
def test_a_mismatch_fails_without_retry_carrying_the_counts(ops, job, tmp_path, xcom):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.operators.shadow_compare import IndexMismatchError

    table = str(tmp_path / "t")
    job["report"], job["rc"] = _mismatch(missing=2, extra=1), 1
    op = ops.IndexShadowCompareOperator(task_id="s", table_uri=table, report_uri=str(tmp_path / "r.json"),
                                        do_xcom_push=xcom)
    ti = _TI()
    with pytest.raises(IndexMismatchError) as info:
        op.execute(_ctx(ti))
    e = info.value
    assert e.mismatches == 3 and e.counts == {"missing": 2, "wrong_location": 0, "extra": 1, "duplicated": 0}
    assert e.report_uri == str(tmp_path / "r.json") and "missing 2, extra 1" in str(e)
    summary = e.summary
    assert summary["samples"]["missing"] == [(f"key-missing-{i}" + "x" * 300)[:120] for i in range(3)]  # few, cut
    assert len(json.dumps(summary)) < 2000
    assert ti.pushed == ({"shadow_compare_summary": summary} if xcom else {})
    import pickle

    again = pickle.loads(pickle.dumps(e))
    assert type(again) is IndexMismatchError and again.summary == summary and str(again) == str(e)


def test_exit_1_without_a_report_is_a_retryable_failure_not_a_mismatch(ops, job, tmp_path):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_bucketindex.hooks.bucketindex import SparkJobFailed

    report = tmp_path / "r.json"
    report.write_text(json.dumps(_mismatch(missing=5)))  # left by an earlier try: must not count
    job["rc"] = 1
    op = ops.IndexShadowCompareOperator(task_id="s", table_uri=str(tmp_path / "t"), report_uri=str(report))
    with pytest.raises(SparkJobFailed) as info:
        op.execute(_ctx())
    assert not isinstance(info.value, AirflowFailException) and not report.exists()
    job["report"] = REPORT  # exit 1 with an ok report: a failure too, not a mismatch
    with pytest.raises(SparkJobFailed):
        op.execute(_ctx())


@pytest.mark.parametrize("rc,final", [(2, True), (3, False), (137, False)])
def test_other_exits(ops, job, tmp_path, rc, final):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    job["rc"] = rc
    op = ops.IndexShadowCompareOperator(task_id="s", table_uri=str(tmp_path / "t"), report_uri=str(tmp_path / "r"))
    with pytest.raises(AirflowException) as info:
        op.execute(_ctx())
    assert isinstance(info.value, AirflowFailException) is final


# -- the notifier -------------------------------------------------------------------------------
def _summary(tmp_path):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.operators.shadow_compare import summarize

    return summarize(_mismatch(missing=2, wrong_location=1), "/lake/t", str(tmp_path / "r.json"))


def test_notifier_message_from_the_exception_and_templates_stay_templates(ops, tmp_path):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.notifications import IndexMismatchNotifier
    from airflow_provider_bucketindex.operators.shadow_compare import IndexMismatchError

    n = IndexMismatchNotifier()
    summary = _summary(tmp_path)
    n({**_ctx(), "exception": IndexMismatchError(summary)})
    sent = n.sent
    assert sent["subject"] == "bucketindex index mismatch: 3 in /lake/t"
    m = sent["message"]
    assert "found 3 mismatches (allowed: 0): missing 2, wrong_location 1, extra 0, duplicated 0" in m
    assert "120 keys checked against scan at instant 20250301100000000" in m
    assert f"Report: {tmp_path}/r.json." in m and "Sample missing: key-missing-0" in m
    assert "task shadow_compare" in m
    assert n.message.startswith("{%")  # rendered on a copy: the next failure renders afresh
    n({**_ctx(), "exception": IndexMismatchError(dict(summary, missing=7, mismatches=8))})
    assert "missing 7" in n.sent["message"]


def test_notifier_reads_xcom_then_the_report_and_alerts_on_other_failures(ops, tmp_path):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.notifications import IndexMismatchNotifier

    summary = _summary(tmp_path)
    n = IndexMismatchNotifier(subject="{{ shadow_compare.mismatches }} in {{ shadow_compare.table_uri }}")
    n({**_ctx(_TI(xcom={"shadow_compare_summary": summary})), "reason": "task_failure"})  # a DAG-level callback
    assert n.sent["subject"] == "3 in /lake/t"
    (tmp_path / "rep.json").write_text(json.dumps(_mismatch(duplicated=4)))
    n = IndexMismatchNotifier(report_uri=f"{tmp_path}/{{{{ params.name }}}}.json")
    n({**_ctx(), "params": {"name": "rep"}})
    assert "duplicated 4" in n.sent["message"] and f"Report: {tmp_path}/rep.json" in n.sent["message"]
    n = IndexMismatchNotifier()
    n({**_ctx(), "exception": RuntimeError("spark-submit died")})
    assert n.sent["subject"].startswith("bucketindex shadow-compare failed")
    assert "failed without a comparison result: spark-submit died" in n.sent["message"]
    n = IndexMismatchNotifier(only_mismatches=True)
    n({**_ctx(), "exception": RuntimeError("spark-submit died")})
    assert n.sent is None


def test_notifier_hands_off_to_notifiers_and_callables(ops, tmp_path):  # type: ignore[no-untyped-def]
    from airflow.sdk import BaseNotifier

    from airflow_provider_bucketindex.notifications import IndexMismatchNotifier
    from airflow_provider_bucketindex.operators.shadow_compare import IndexMismatchError

    got = []

    class Smtpish(BaseNotifier):
        template_fields = ("subject", "html_content")

        def __init__(self, subject, html_content):  # type: ignore[no-untyped-def]
            super().__init__()
            self.subject, self.html_content = subject, html_content

        def notify(self, context):  # type: ignore[no-untyped-def]
            got.append(("smtp", self.subject, self.html_content))

    def broken(context):  # type: ignore[no-untyped-def]
        raise RuntimeError("slack down")

    mail = Smtpish("{{ shadow_compare_subject }}", "<p>{{ shadow_compare_message }}</p>")
    n = IndexMismatchNotifier(notifiers=[mail, broken, lambda ctx: got.append(("cb", ctx["shadow_compare"]["missing"]))])
    for missing in (2, 5):
        summary = dict(_summary(tmp_path), missing=missing)
        n({**_ctx(), "exception": IndexMismatchError(summary)})
    assert [g[0] for g in got] == ["smtp", "cb", "smtp", "cb"]
    assert got[0][1] == "bucketindex index mismatch: 3 in /lake/t" and "missing 2," in got[0][2]
    assert "missing 5," in got[2][2] and got[3] == ("cb", 5)  # each run renders the user's templates afresh
    assert mail.html_content == "<p>{{ shadow_compare_message }}</p>"
    with pytest.raises(RuntimeError, match="slack down"):  # every channel failed: the callback fails
        IndexMismatchNotifier(notifiers=broken)({**_ctx(), "exception": IndexMismatchError(_summary(tmp_path))})


class _StoreComms:
    """The task runner's channel to Airflow for asset state store messages (the only ones it
    answers, besides "no such connection"), over a dict keyed by
    (asset URI, key); ``known`` lists the Asset URIs Airflow has (a write to another is refused,
    as the Execution API refuses it: 404)."""

    def __init__(self, known: set[str]) -> None:
        self.known, self.values, self.sent = known, {}, []

    def send(self, msg):  # type: ignore[no-untyped-def]
        from airflow.sdk.execution_time.comms import AssetStateStoreResult, ErrorResponse, ErrorType

        if type(msg).__name__ == "GetConnection":  # bucketindex_default is not defined here
            return ErrorResponse(error=ErrorType.CONNECTION_NOT_FOUND, detail={"conn_id": msg.conn_id})
        self.sent.append(type(msg).__name__)
        if type(msg).__name__ == "GetAssetStateStoreByUri":
            if (msg.uri, msg.key) in self.values:
                return AssetStateStoreResult(value=self.values[(msg.uri, msg.key)])
            return ErrorResponse(error=ErrorType.ASSET_STORE_NOT_FOUND, detail={"key": msg.key})
        if type(msg).__name__ == "SetAssetStateStoreByUri":
            if msg.uri not in self.known:
                raise RuntimeError(f"Asset with uri={msg.uri!r} not found")
            self.values[(msg.uri, msg.key)] = msg.value
            return None
        raise AssertionError(type(msg).__name__)


def test_since_last_good_is_kept_in_the_table_assets_state_store(ops, job, tmp_path, monkeypatch):  # type: ignore
    from airflow.sdk.execution_time import task_runner

    from airflow_provider_bucketindex.lineage import table_asset_uri
    from airflow_provider_bucketindex.operators.shadow_compare import IndexMismatchError, since_key

    table = str(tmp_path / "lake" / "ventes été 50%")
    asset = table_asset_uri(table)
    comms = _StoreComms(known={asset})
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", comms, raising=False)
    key = since_key("d", "s")

    def run(instant, spelled=table, rc=0, report=None):  # type: ignore[no-untyped-def]
        job["report"], job["rc"] = report or dict(REPORT, table=table, instant=instant), rc
        op = ops.IndexShadowCompareOperator(task_id="s", table_uri=spelled, since="", since_last_good=True,
                                            report_uri=str(tmp_path / "r.json"))
        op.execute(_ctx(_TI(xcom={"return_value": {"table_uri": table, "instant": "20240101000000000"}})))
        args = job["calls"][-1][1]
        return args[args.index("--since") + 1] if "--since" in args else None

    # nothing in the store: the XCom summary of the last good run (the fallback) gives since
    assert run("20250301100000000") == "20240101000000000"
    assert comms.values == {(asset, key): "20250301100000000"}
    # the next run: from the store, whatever the table's spelling (file:// URI, trailing /)
    from urllib.parse import quote

    assert run("20250301110000000", spelled=f"file://{quote(table)}/") == "20250301100000000"
    assert comms.values == {(asset, key): "20250301110000000"}
    # a mismatch records nothing: the next run compares since the last good one again
    with pytest.raises(IndexMismatchError):
        run("20250301120000000", rc=1, report=dict(_mismatch(missing=1), instant="20250301120000000"))
    assert comms.values == {(asset, key): "20250301110000000"}
    assert run("20250301130000000") == "20250301110000000"


def test_since_last_good_without_a_store_uses_the_xcom_and_says_so(ops, job, tmp_path, monkeypatch):  # type: ignore
    from airflow.sdk.execution_time import task_runner

    table = str(tmp_path / "t")
    comms = _StoreComms(known=set())  # the table's Asset is not registered in Airflow
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", comms, raising=False)
    job["report"] = dict(REPORT, table=table)
    op = ops.IndexShadowCompareOperator(task_id="s", table_uri=table, since_last_good=True,
                                        report_uri=str(tmp_path / "r.json"))
    prev = {"table_uri": table, "instant": "20240101000000000"}
    assert op.execute(_ctx(_TI(xcom={"return_value": prev})))["ok"] is True
    assert job["calls"][-1][1][job["calls"][-1][1].index("--since") + 1] == "20240101000000000"
    assert comms.sent == ["GetAssetStateStoreByUri", "SetAssetStateStoreByUri"] and comms.values == {}
    # another table's summary is not this table's since; an explicit since wins over both
    other = {"table_uri": str(tmp_path / "other"), "instant": "20240101000000000"}
    op = ops.IndexShadowCompareOperator(task_id="s", table_uri=table, since_last_good=True,
                                        report_uri=str(tmp_path / "r.json"))
    op.execute(_ctx(_TI(xcom={"return_value": other})))
    assert "--since" not in job["calls"][-1][1]
    op = ops.IndexShadowCompareOperator(task_id="s", table_uri=table, since="20230101", since_last_good=True,
                                        report_uri=str(tmp_path / "r.json"))
    op.execute(_ctx())
    assert job["calls"][-1][1][job["calls"][-1][1].index("--since") + 1] == "20230101"
    # no task runner at all (SUPERVISOR_COMMS unset): the XCom, nothing written
    monkeypatch.delattr(task_runner, "SUPERVISOR_COMMS", raising=False)
    op = ops.IndexShadowCompareOperator(task_id="s", table_uri=table, since_last_good=True,
                                        report_uri=str(tmp_path / "r.json"))
    op.execute(_ctx(_TI(xcom={"return_value": prev})))
    assert job["calls"][-1][1][job["calls"][-1][1].index("--since") + 1] == "20240101000000000"
