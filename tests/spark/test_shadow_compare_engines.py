"""``shadow-compare`` on both engines: the Spark job and the in-process Arrow comparison give equal
reports (all but ``elapsed_ms``) on the same damaged tables -- record and bucket, copy-on-write
and merge-on-read, every ``--against``, with and without ``--since``, sampled -- with more
mismatches of a kind than a report samples, so the samples' rule (the smallest names) is held too.

The tables are written by the Arrow upsert (fast) and damaged as tests/spark/test_shadow_compare.py
damages its tables: entries pointing elsewhere, tombstones for live keys, entries for deleted or
never-written keys, an entry in the wrong bucket, keys twice in the data, rows in the wrong bucket.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.shadow_compare import run_shadow_compare as arrow_compare
from spark_jobs.jobs.shadow_compare import run_shadow_compare as spark_compare
from spark_jobs.table.shadow import SAMPLES, ShadowOptions
from spark_jobs.table.table import Table
from tests.unit.test_arrow_shadow_compare import (
    DELETED,
    KEYS,
    REGION_OF,
    REGIONS,
    add_index_delta,
    bucket_of_key,
    build,
    location,
    rows,
    upsert,
    write_batch,
)

pytestmark = pytest.mark.spark


def _duplicate(t: Table, key: str) -> None:
    s = location(t, key)
    data = pq.read_table(t.abs(s.path))
    pq.write_table(pa.concat_tables([data, data.filter(pc.equal(data.column("_bi_key"), key))]), t.abs(s.path))


def _damage_record(t: Table) -> None:
    """Every kind of mismatch, missing more than SAMPLES times; the index deltas one per bucket."""
    nb = t.num_buckets()
    deltas: dict[int, list[tuple[str, object]]] = {b: [] for b in range(nb)}
    s5, s6, s3 = location(t, KEYS[5]), location(t, KEYS[6]), location(t, KEYS[3])
    deltas[bucket_of_key(t, KEYS[5])].append((KEYS[5], (s5.partition, "no-such-file-group")))
    other = next(r for r in REGIONS if r != REGION_OF[KEYS[6]])
    deltas[bucket_of_key(t, KEYS[6])].append((KEYS[6], (f"region={other}", s6.file_id)))
    for k in KEYS[12:]:  # 12 tombstones for live keys: more missing keys than a report samples
        deltas[bucket_of_key(t, k)].append((k, None))
    s0 = t.view().slices()[0]
    for k in (DELETED, "ghost é", "ghost 2"):  # entries without a row
        deltas[bucket_of_key(t, k)].append((k, (s0.partition, s0.file_id)))
    deltas[bucket_of_key(t, KEYS[3])].append((KEYS[3], None))  # the entry in another bucket
    deltas[(bucket_of_key(t, KEYS[3]) + 1) % nb].append((KEYS[3], (s3.partition, s3.file_id)))
    for b, entries in deltas.items():
        if entries:
            add_index_delta(t, b, [k for k, _ in entries], [v for _, v in entries])
    _duplicate(t, KEYS[9])


def _damage_bucket(t: Table) -> None:
    s = t.view().slices()[0]
    other = next(x for x in t.view().slices() if x.partition != s.partition)
    data = pq.read_table(t.abs(s.path))
    strays = [k for k in (f"stray{i}" for i in range(100)) if f"{bucket_of_key(t, k):08d}" != s.file_id][:SAMPLES + 2]
    moved = pq.read_table(t.abs(other.path)).column("_bi_key")[0].as_py()  # then in two partitions
    template = data.slice(0, 1).to_pylist()[0]
    extra = [template | {"_bi_key": k, "id": k} for k in [*strays, moved]]
    pq.write_table(pa.concat_tables([data, pa.Table.from_pylist(extra, schema=data.schema)]), t.abs(s.path))


def _equal(spark, uri: str, opts: ShadowOptions) -> dict:
    a, s = arrow_compare(uri, opts), spark_compare(spark, uri, opts)
    a.pop("elapsed_ms"), s.pop("elapsed_ms")
    assert a == s, (opts, a, s)
    return a


#: (against, since: None | "first" | "second" commit's instant, sample_fraction) per table: few,
#: since each is a Spark job; every --against, --since before and after the damage, a sample.
#: (tests/unit/test_arrow_shadow_compare.py runs the other combinations on the Arrow engine.)
CASES = {
    "record": [("scan", None, 1.0), ("scan", "first", 1.0), ("bucket", "second", 0.5)],
    "bucket": [("global_simple", None, 1.0), ("scan", "first", 0.5)],
}


@pytest.mark.parametrize("index, table_type", [("record", "copy_on_write"), ("bucket", "merge_on_read")])
def test_both_engines_report_the_same_on_damaged_tables(spark, tmp_path, index, table_type):
    uri = build(tmp_path, index, table_type)
    t = Table.load(uri)
    instants = dict(zip(("first", "second"), (i.timestamp for i in t.timeline.completed())))
    (_damage_record if index == "record" else _damage_bucket)(t)
    upsert(uri, write_batch(tmp_path / "b3.parquet", rows(["new1", "new2 é", KEYS[13]], 3)), index, table_type)
    reports = [_equal(spark, uri, ShadowOptions(against=against, since=instants.get(since), sample_fraction=fraction,
                                                max_mismatches=3))
               for against, since, fraction in CASES[index]]
    full = reports[0]
    assert full["mismatches"] > 3 and not full["ok"], full
    if index == "record":
        assert full["missing"] > SAMPLES and {full[k] > 0 for k in ("wrong_location", "extra", "duplicated")} == {True}
        assert any(label.startswith("fp:") for label in full["samples"]["extra"]), full
        assert reports[1]["commits_since"] >= 3 and reports[1]["extra"] >= 3, reports[1]  # the deltas, the upsert
    else:
        # global_simple: the key in two partitions is a duplicate
        assert full["wrong_location"] > SAMPLES and full["duplicated"] == 1, full
