"""The in-process engine: actions executed on Arrow tables with pyarrow compute and numpy.

No JVM and no ``pyspark`` import anywhere below this package (a test holds it to that): a
small batch pays for its rows, not for a Spark session. The rules each action follows live
in :mod:`spark_jobs.table.action`; this package and :mod:`spark_jobs.jobs` (Spark) only
execute them, and the equivalence tests hold both to the same snapshots.
"""
