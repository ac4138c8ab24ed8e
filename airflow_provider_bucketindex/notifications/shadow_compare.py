"""IndexMismatchNotifier: the alert of a failed shadow-compare, in Airflow's notifier style.

Usable wherever Airflow takes a callback::

    IndexShadowCompareOperator(
        task_id="shadow_compare", table_uri=...,
        on_failure_callback=IndexMismatchNotifier(
            notifiers=[SmtpNotifier(to="oncall@example.com", subject="{{ shadow_compare_subject }}",
                                    html_content="{{ shadow_compare_message }}")],
        ),
    )

The message carries the mismatch counts and the report location. They are read, in this
order, from the failing task's exception (an
:class:`~airflow_provider_bucketindex.operators.shadow_compare.IndexMismatchError`), the
summary it pushed to XCom (``shadow_compare_summary``, so a DAG-level ``on_failure_callback``
finds it too), or the report file (``report_uri``).
"""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any, Callable, Sequence, Union

from airflow.sdk import BaseNotifier

from airflow_provider_bucketindex.operators.shadow_compare import (
    MISMATCH_KINDS,
    SUMMARY_XCOM_KEY,
    IndexMismatchError,
    summarize,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["DEFAULT_MESSAGE", "DEFAULT_SUBJECT", "IndexMismatchNotifier"]

DEFAULT_SUBJECT = (
    "{% if shadow_compare.status == 'mismatch' %}bucketindex index mismatch: {{ shadow_compare.mismatches }} "
    "in {{ shadow_compare.table_uri }}{% else %}bucketindex shadow-compare failed: "
    "{{ shadow_compare.table_uri or (ti.task_id if ti else run_id) }}{% endif %}"
)
DEFAULT_MESSAGE = (
    "{% set s = shadow_compare %}"
    "{% if s.status == 'mismatch' %}"
    "shadow-compare of {{ s.table_uri }} found {{ s.mismatches }} mismatch{{ '' if s.mismatches == 1 else 'es' }} (allowed: {{ s.max_mismatches }}): "
    "missing {{ s.missing }}, wrong_location {{ s.wrong_location }}, extra {{ s.extra }}, "
    "duplicated {{ s.duplicated }}; {{ s.keys_checked }} key{{ '' if s.keys_checked == 1 else 's' }} checked against {{ s.against }} "
    "at instant {{ s.instant }}{% if s.since %} (commits since {{ s.since }}){% endif %}."
    "{% for kind, keys in (s.samples or {}).items() %} Sample {{ kind }}: {{ keys | join(', ') }}.{% endfor %}"
    "{% else %}"
    "shadow-compare{% if s.table_uri %} of {{ s.table_uri }}{% endif %} failed without a comparison result: "
    "{{ s.error }}."
    "{% endif %}"
    " Report: {{ s.report_uri or 'none' }}."
    " DAG {{ dag.dag_id if dag else '' }}, run {{ run_id }}{% if ti %}, task {{ ti.task_id }}{% endif %}."
)

Handoff = Union[BaseNotifier, Callable[..., Any]]


class IndexMismatchNotifier(BaseNotifier):
    """Send an alert when a shadow-compare task (or its run) fails: log it and hand it off.

    :param notifiers: the notifiers to hand the alert to -- any ``BaseNotifier`` (e.g. the SMTP
        or Slack provider's ``SmtpNotifier``/``SlackNotifier``) or callable taking the context.
        They get the context with ``shadow_compare`` (the summary), ``shadow_compare_subject``
        and ``shadow_compare_message`` (rendered) added, so their own templates can use
        ``{{ shadow_compare_message }}``. Each gets a copy: templates render afresh every time.
    :param subject: the subject (templated; ``shadow_compare`` is in the context).
    :param message: the message (templated). The default names the counts per kind, the
        keys checked, the instant, up to three sample keys per kind and the report location.
    :param report_uri: where to read the report when neither the exception nor XCom has the
        counts (templated; e.g. the operator's ``report_uri`` template).
    :param task_id: the shadow-compare task whose XCom summary to read (default: the failing
        task of the context); for a DAG-level callback.
    :param only_mismatches: send nothing when the task failed for another reason than a
        mismatch (a Spark failure, bad input). Default False: every failure is sent.

    After a call, ``sent`` holds what was rendered (``subject``, ``message``, ``summary``) or
    None when nothing was sent.
    """

    template_fields: Sequence[str] = ("subject", "message", "report_uri")

    def __init__(self, *, notifiers: Sequence[Handoff] | Handoff | None = None, subject: str = DEFAULT_SUBJECT,
                 message: str = DEFAULT_MESSAGE, report_uri: str | None = None, task_id: str | None = None,
                 only_mismatches: bool = False) -> None:
        super().__init__()
        self.notifiers = notifiers
        self.subject = subject
        self.message = message
        self.report_uri = report_uri
        self.task_id = task_id
        self.only_mismatches = only_mismatches
        self.sent: dict[str, Any] | None = None

    def __call__(self, *args: Any) -> None:
        # BaseNotifier renders template fields in place: render a copy, so the templates stay
        # templates for the next failure (one instance serves every run of the DAG).
        twin = copy.copy(self)
        twin.sent = None
        super(IndexMismatchNotifier, twin).__call__(*args)
        self.sent = twin.sent

    def _update_context(self, context: Context) -> Context:
        context = super()._update_context(context)
        context["shadow_compare"] = self.summary_of(context)  # type: ignore[typeddict-unknown-key]
        return context

    # -- where the counts come from -------------------------------------------------------------
    def summary_of(self, context: Context) -> dict[str, Any]:
        """The failing compare's summary plus ``status`` (``mismatch`` or ``failed``) and ``error``."""
        ctx: Any = context
        exc = ctx.get("exception")
        summary: dict[str, Any] | None = None
        if isinstance(exc, IndexMismatchError):
            summary = dict(exc.summary)
        if summary is None:
            summary = self._from_xcom(ctx)
        if summary is None and self.report_uri:
            summary = self._from_report(str(self.render_template(self.report_uri, ctx)), task=ctx.get("task"))
        summary = dict(summary or {})
        mismatch = summary.get("ok") is False
        for kind in ("table_uri", "report_uri", "mismatches", "keys_checked", "instant", *MISMATCH_KINDS):
            summary.setdefault(kind, None)
        summary.setdefault("samples", {})
        summary["status"] = "mismatch" if mismatch else "failed"
        summary["error"] = str(exc) if exc is not None else (ctx.get("reason") or "unknown")
        return summary

    def _from_xcom(self, ctx: Any) -> dict[str, Any] | None:
        ti = ctx.get("ti")
        if ti is None:
            return None
        try:
            value = ti.xcom_pull(task_ids=self.task_id or ti.task_id, key=SUMMARY_XCOM_KEY)
        except Exception as e:  # a callback must still alert when XCom cannot be read
            self.log.warning("could not read the shadow-compare summary from XCom: %s", e)
            return None
        return value if isinstance(value, dict) else None

    def _from_report(self, uri: str, *, task: Any = None) -> dict[str, Any] | None:
        """The report file, read with the failed task's storage options when it has them (a report
        on object storage is reached as the task reached it)."""
        from contextlib import nullcontext

        from spark_jobs.io.filesystem import resolve

        scope = getattr(task, "storage_scope", None)
        try:
            with scope() if callable(scope) else nullcontext():
                io, path = resolve(uri)
                report = json.loads(io.read_bytes(path))
        except Exception as e:
            from spark_jobs.io.storage import redact_uri

            self.log.warning("could not read the shadow-compare report %s: %s", redact_uri(uri), redact_uri(str(e)))
            return None
        return summarize(report, str(report.get("table") or ""), uri) if isinstance(report, dict) else None

    # -- sending ------------------------------------------------------------------------------
    def notify(self, context: Context) -> None:
        ctx: Any = context
        summary = ctx["shadow_compare"]
        if self.only_mismatches and summary["status"] != "mismatch":
            self.log.info("shadow-compare failed without a mismatch; only_mismatches: nothing sent")
            return
        ctx["shadow_compare_subject"] = self.subject
        ctx["shadow_compare_message"] = self.message
        self.log.error("%s\n%s", self.subject, self.message)
        self.sent = {"subject": self.subject, "message": self.message, "summary": summary}
        targets = self.notifiers
        if targets is None:
            return
        if isinstance(targets, BaseNotifier) or callable(targets) and not isinstance(targets, (list, tuple)):
            targets = [targets]
        errors = []
        for target in targets:
            try:
                if isinstance(target, BaseNotifier):
                    copy.copy(target)(context)  # renders its own templates in place: a copy each time
                else:
                    target(context)
            except Exception as e:  # one broken channel must not silence the others
                self.log.error("hand-off to %r failed: %s", target, e)
                errors.append(e)
        if errors and len(errors) == len(targets):
            raise errors[0]
