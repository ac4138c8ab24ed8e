"""The provider's ``[bucketindex]`` Airflow configuration section, read here, in the provider; declared
in the package root (:data:`airflow_provider_bucketindex.CONFIG_OPTIONS`, the provider info's ``config``,
so ``airflow config list`` shows it with its defaults -- the root, because Airflow reads provider info
while it loads its configuration, and that must import no submodule of the provider).

Why a section and not only environment variables: an Airflow deployment sets worker-wide defaults
in ``airflow.cfg`` or ``AIRFLOW__BUCKETINDEX__*`` variables, beside the rest of its settings, and
``airflow config get-value bucketindex memory_budget`` shows what a worker will use.

Where a value comes from, highest first: the task's argument, the ``bucketindex`` connection's
extra, this section, then what the core reads itself (``$BUCKETINDEX_ARROW_MEMORY_BUDGET``,
``$BUCKETINDEX_DRIVER_MEMORY``), then the built-in default. An option left empty (its default)
changes nothing: the environment variables keep working as documented.

The core package (``spark_jobs``) never imports Airflow: the provider reads the section and passes
the value down as the explicit override the core already takes (``memory_budget(override)``,
``local_driver_memory(override)``, an upsert's options). Importing this module imports nothing of
Airflow either (the parse-time import probe covers it); :func:`option` does, when called.
"""

from __future__ import annotations

from airflow_provider_bucketindex import CONFIG_OPTIONS as OPTIONS
from airflow_provider_bucketindex import CONFIG_SECTION as SECTION
from airflow_provider_bucketindex import provider_config

__all__ = ["SECTION", "OPTIONS", "TABLE_DEFAULT_OPTIONS", "provider_config", "option", "table_defaults"]
#: the options an upsert uses when it creates a table (and ``source_format`` for every upsert)
TABLE_DEFAULT_OPTIONS = ("index", "num_buckets", "table_type", "source_format")


def option(name: str) -> str | None:
    """The ``[bucketindex] name`` value (``airflow.cfg`` or ``AIRFLOW__BUCKETINDEX__<NAME>``), None
    when empty or unset. Read through Airflow's configuration in the running process (a task, the
    triggerer), so a worker's own settings apply."""
    if name not in OPTIONS:
        raise KeyError(f"[{SECTION}] has no option {name!r}")
    from airflow.providers.common.compat.sdk import conf

    value = conf.get(SECTION, name, fallback=None)
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def table_defaults() -> dict[str, str]:
    """The section's defaults for tables an upsert creates (only the options that are set)."""
    return {name: value for name in TABLE_DEFAULT_OPTIONS if (value := option(name)) is not None}
