"""Example DAGs shipped with the provider (``dags/`` in the repository links here).

``bucketindex demo`` runs them from the installed package, so the demo also works from
a wheel; users copy the files into their own DAG folder.
"""
