"""The words of the table format a command line offers: index types, table types, the forms of
``--as-of``. A leaf (it imports nothing of the project, nor pyarrow): the CLI's parser takes its
choices and help texts from here, so ``bucketindex --help`` and a usage error (exit 2) answer
without loading the table core, pyarrow and numpy -- about 0.4 s of a cold process. The core
(``spark_jobs.table.config``, ``spark_jobs.table.timeline``) re-exports them under the same names.
"""

from __future__ import annotations

INDEX_RECORD = "record"
INDEX_BUCKET = "bucket"
INDEX_GLOBAL_SIMPLE = "global_simple"
INDEX_TYPES = (INDEX_RECORD, INDEX_BUCKET, INDEX_GLOBAL_SIMPLE)
#: copy-on-write rewrites a file group's base per upsert; merge-on-read appends a log to it
#: (format.md §5.1) and data compaction folds the logs later
COPY_ON_WRITE = "copy_on_write"
MERGE_ON_READ = "merge_on_read"
TABLE_TYPES = (COPY_ON_WRITE, MERGE_ON_READ)

#: what ``--as-of`` and ``--since`` accept, for help texts and the one-line refusal
INSTANT_FORM = "17 digits yyyyMMddHHmmssSSS, UTC, as `bucketindex show` lists them"
TIME_FORMS = ("2026-11-25T09:24:00, 2026-11-25 09:24, 2026-11-25T09:24:00+01:00, 2026-11-25T08:24:00Z, "
              "or a date 2026-11-25, its midnight; a time without a zone is UTC")
AS_OF_FORMS = f"an instant ({INSTANT_FORM}) or an ISO-8601 time ({TIME_FORMS})"

#: the projections a table may ask for, written with each commit: a Delta Lake log
#: (``_delta_log/``, format.md §11) and Iceberg metadata (``metadata/``, §12)
MIRROR_DELTA = "delta"
MIRROR_ICEBERG = "iceberg"
MIRRORS = (MIRROR_DELTA, MIRROR_ICEBERG)
