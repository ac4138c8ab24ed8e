"""The ``bucketindex`` console script.

Every verb but ``demo`` and ``connect-server`` is a table operation implemented in
:mod:`spark_jobs.cli`; ``demo`` runs the example ingest DAG through Airflow, so it lives on
the Airflow side of the dependency line (Airflow is imported only when ``demo`` runs);
``connect-server`` runs a local Spark Connect server for ``--remote`` jobs
(:func:`spark_jobs.jobs.connect.serve`).
"""

from __future__ import annotations

import sys

from spark_jobs import cli as table_cli

__all__ = ["main"]

DEMO_HELP = "the whole pipeline on embedded defaults (sample data, Airflow with SQLite, local Spark), with a summary"
CONNECT_SERVER_HELP = "run a local Spark Connect server for --remote jobs (prints its sc:// URL; Ctrl-C stops it)"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "demo":
        from airflow_provider_bucketindex.demo import main as demo_main  # lazy: imports Airflow

        return demo_main(args[1:])
    if args and args[0] == "connect-server":
        from spark_jobs.jobs.connect import serve

        return serve(args[1:])
    # argv None: called as the program (console script, python -m), not by a user's program
    return table_cli.main(args, extra_verbs={"demo": DEMO_HELP, "connect-server": CONNECT_SERVER_HELP},
                          console=argv is None)


if __name__ == "__main__":
    sys.exit(main())
