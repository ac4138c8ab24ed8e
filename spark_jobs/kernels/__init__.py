"""Per-file kernels: the pyspark-free functions over Arrow that both engines run.

The Spark engine (:mod:`spark_jobs.jobs`) wraps them in ``mapInArrow``/``applyInArrow`` tasks;
the Arrow engine (:mod:`spark_jobs.arrow_engine`) calls them in this process. They import the
table core only -- never an engine, ``pyspark`` or ``airflow`` (``tests/unit/test_layering.py``).
"""
