"""The part every Spark-job operator shares: connection, master, Spark options, lazy hook."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator

from airflow_provider_bucketindex import DEFAULT_CONN_ID
from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook

__all__ = ["BucketIndexSparkOperator"]


class BucketIndexSparkOperator(BaseOperator):
    """Base of operators that submit a bucketindex Spark job.

    :param conn_id: a ``bucketindex`` connection (Spark master, options, table defaults).
    :param master: Spark master URL overriding the connection's (templated).
    :param conf: Spark properties over the connection's (templated).
    :param name: Spark application name (templated; default ``bucketindex-<verb>``).
    :param env_vars: extra environment for spark-submit (templated).
    :param driver_memory, executor_memory, executor_cores, total_executor_cores,
        num_executors, verbose: spark-submit options, as in the Spark provider.

    Nothing happens in ``__init__``: the hook (and through it the connection) is built
    on first use in ``execute``, after templates are rendered.
    """

    def __init__(
        self,
        *,
        conn_id: str = DEFAULT_CONN_ID,
        master: str | None = None,
        conf: dict[str, Any] | None = None,
        name: str | None = None,
        env_vars: dict[str, Any] | None = None,
        driver_memory: str | None = None,
        executor_memory: str | None = None,
        executor_cores: int | None = None,
        total_executor_cores: int | None = None,
        num_executors: int | None = None,
        verbose: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.master = master
        self.conf = conf
        self.name = name
        self.env_vars = env_vars
        self.driver_memory = driver_memory
        self.executor_memory = executor_memory
        self.executor_cores = executor_cores
        self.total_executor_cores = total_executor_cores
        self.num_executors = num_executors
        self.verbose = verbose

    @cached_property
    def hook(self) -> BucketIndexHook:
        return BucketIndexHook(
            conn_id=self.conn_id,
            master=self.master or None,
            conf=self.conf,
            name=self.name or None,
            env_vars=self.env_vars,
            driver_memory=self.driver_memory,
            executor_memory=self.executor_memory,
            executor_cores=self.executor_cores,
            total_executor_cores=self.total_executor_cores,
            num_executors=self.num_executors,
            verbose=self.verbose,
        )

    def on_kill(self) -> None:
        hook = self.__dict__.get("hook")  # never build a hook just to kill nothing
        if hook is not None:
            hook.on_kill()
