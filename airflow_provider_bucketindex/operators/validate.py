"""ValidateTableOperator: the full index <-> data check, failing the task on a mismatch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_bucketindex.hooks.bucketindex import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, SparkJobFailed
from airflow_provider_bucketindex.operators.base import BucketIndexSparkOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["ValidateTableOperator"]


class ValidateTableOperator(BucketIndexSparkOperator):
    """Run ``bucketindex validate TABLE`` with spark-submit; fail (without retrying) when
    the check finds a problem (exit status 1) or the table is unusable (2).

    :param table_uri: the table (templated).
    """

    template_fields: Sequence[str] = ("table_uri", "master", "conf", "name", "env_vars")
    ui_color = "#e6f4ea"

    def __init__(self, *, table_uri: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.table_uri = table_uri

    def spark_submit_command(self) -> list[str]:
        """The exact spark-submit command ``execute`` runs (templates rendered)."""
        return self.hook.build_command("validate", [str(self.table_uri)])

    def execute(self, context: Context) -> dict[str, Any]:
        table_uri = str(self.table_uri)
        try:
            self.submit_job(context, "validate", [table_uri])
        except SparkJobFailed as e:
            if e.returncode == EXIT_CHECK_FAILED:
                raise AirflowFailException(f"validate found a problem in {table_uri}: {e.reason}") from e
            if e.returncode == EXIT_BAD_INPUT:
                raise AirflowFailException(str(e)) from e
            raise
        self.set_lineage(inputs=[table_uri])
        last = self.hook.last_commit(table_uri)
        return {"table_uri": table_uri, "valid": True, "instant": last["instant"] if last else None}
