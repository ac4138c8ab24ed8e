"""``bucketindex_test_shadow_compare``: the example shadow-compare DAG from its own factory,
its notifier handing off to a notifier "the user already has" -- one that appends its own
rendered template (``{{ shadow_compare_message }}`` plus the counts) as a JSON line to the file
named by ``BUCKETINDEX_TEST_ALERTS``, as an SMTP or Slack notifier would send it."""

from __future__ import annotations

import json
import os

from airflow.sdk import BaseNotifier

from airflow_provider_bucketindex.dags.bucketindex_shadow_compare import build_dag


class FileNotifier(BaseNotifier):
    template_fields = ("text", "counts")

    def __init__(self, *, text: str, counts: str) -> None:
        super().__init__()
        self.text, self.counts = text, counts

    def notify(self, context):  # type: ignore[no-untyped-def]
        path = os.environ.get("BUCKETINDEX_TEST_ALERTS") or "/tmp/bucketindex-test-alerts.jsonl"
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"text": self.text, "counts": self.counts}) + "\n")


dag = build_dag("bucketindex_test_shadow_compare", notifiers=[FileNotifier(
    text="{{ shadow_compare_message }}",
    counts="{{ shadow_compare.missing }}/{{ shadow_compare.wrong_location }}/{{ shadow_compare.extra }}/"
           "{{ shadow_compare.duplicated }} of {{ shadow_compare.keys_checked }} at {{ shadow_compare.report_uri }}",
)])
