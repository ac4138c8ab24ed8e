"""``bucketindex demo`` and what it runs on -- not part of the provider proper.

* :mod:`.runner`: the demo itself (sample batches -> the example DAGs through ``dag.test()``
  on a private Airflow -> a summary checked against the oracle);
* :mod:`.sample_data`: sample batches, the reduce-by-key oracle, reading a snapshot (pyarrow);
* :mod:`.sandbox`: a self-contained Airflow in one folder (home, SQLite DB, DAG folder,
  connection) and a report of a ``dag.test()`` run read back from the metadata DB, which it
  reads through Airflow's own models -- fine for a demo and the tests, not for operators.

The end-to-end tests use the same modules. Importing this package imports nothing heavy.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """``bucketindex demo [options]`` (Airflow is imported only once its environment is set)."""
    from airflow_provider_bucketindex.demo.runner import main as run

    return run(argv)
