"""Example DAGs shipped with the provider (``dags/`` in the repository links here).

``bucketindex demo`` runs them from the installed package, so the demo also works from
a wheel; users copy the files into their own DAG folder.

Why ``dags`` and not ``example_dags``: with ``[core] load_examples`` on (Airflow's default),
Airflow adds every installed provider's ``example_dags`` folder as a DAG bundle, so the packaged
files were parsed beside a user's copies of them -- the same DAG ids in two bundles, and the
user's edited copy silently lost. Under this name Airflow never loads them by itself: the
user's copy is the one that runs (``tests/airflow/test_dag_integrity.py``).
"""
