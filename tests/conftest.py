"""Test-wide environment: executors must run this interpreter (it has pyarrow)."""

import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# spark-submit from a pip-installed pyspark lives beside this interpreter
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
