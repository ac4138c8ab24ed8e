"""Entry point for ``spark-submit``: ``spark-submit [...] --py-files spark_jobs.zip submit.py VERB ARGS``.

Takes the same verbs and options as the ``bucketindex`` CLI; the Spark master and
configuration come from spark-submit.
"""

import sys

from spark_jobs.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], submitted=True))
