"""Why the Delta projection has no fresh view (format.md §11, issue 39 item 2): what the
installed Delta readers do with a deletion vector, pinned so that an upgrade that changes it
fails here and the refusal of ``mirror --enable delta --view fresh`` is measured again.

Each table is ``benchmarks/delta_dv_probe.py``'s: one 4-row Parquet file whose inline deletion
vector drops rows 1 and 3, in a partition directory named as the product names them
(``layout.partition_path``), its ``add.path`` in a form a writer could choose. The right answer
is ids ``[0, 2]``; ``[0, 1, 2, 3]`` is the deleted rows read back (wrong rows)."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pytest

from spark_jobs.table.layout import partition_path

deltalake = pytest.importorskip("deltalake")
pl = pytest.importorskip("polars")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import delta_dv_probe as probe
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

LIVE, ALL = [0, 2], [0, 1, 2, 3]
#: values whose directory name holds a ``%XX`` escape on disk (every value outside
#: ``[A-Za-z0-9*._-]`` and space: ``/``, ``%``, ``+``, ``~``, non-ASCII, a leading ``__``)
ESCAPED = ["a/b", "a%b", "a+b", "café", "日本", "__NULL__", "a*b~c"]
#: values whose directory name holds none (space is ``+``, null ``__NULL__``, a long value a
#: prefix, ``~`` and a hex hash)
PLAIN = ["x", "a b", None, "", "x" * 300, "-12.50", "2024-03-31"]


def _table(tmp_path: Path, value: str | None, form: str) -> str:
    root = str(tmp_path / "t")
    probe.write_table(root, "i", partition_path("region", value), form)
    return root


def _query_builder(root: str) -> list[int]:
    t = pa.table(deltalake.QueryBuilder().register("t", deltalake.DeltaTable(root)).execute("select id from t"))
    return sorted(t.column("id").to_pylist())


def _polars(root: str) -> tuple[list[int], list[int]]:
    return sorted(pl.read_delta(root)["id"].to_list()), sorted(pl.scan_delta(root).collect()["id"].to_list())


@pytest.mark.parametrize("value", ESCAPED + PLAIN, ids=repr)
def test_query_builder_applies_the_vector_in_every_uri_form(tmp_path, value):
    for form in ("encoded", "pchar", "absolute"):
        assert _query_builder(_table(tmp_path, value, form)) == LIVE, form


def test_the_pyarrow_readers_refuse_the_table_not_the_rows(tmp_path):
    root = _table(tmp_path, "x", "encoded")
    for read in (lambda: deltalake.DeltaTable(root).to_pyarrow_table(),
                 lambda: deltalake.DeltaTable(root).to_pyarrow_dataset().to_table()):
        with pytest.raises(deltalake.exceptions.DeltaProtocolError, match="deletionVectors"):
            read()


@pytest.mark.parametrize("value", ESCAPED, ids=repr)
def test_polars_reads_the_deleted_rows_of_a_path_with_an_escape(tmp_path, value):
    """The cause (polars/io/delta/_dataset.py, ``_extract_delta_deletion_vectors``): the scanned
    paths are ``file_uris()`` (decoded), the vectors are keyed by ``deletion_vectors()``'s
    ``filepath`` (a URL, still encoded, only ``file://`` stripped), joined on string equality.
    A directory name holding ``%`` is ``%25`` in every URI form, so no form matches. If this
    fails, Polars changed: measure again (benchmarks/delta_dv_probe.py) and revisit format.md
    §11's refusal of the Delta fresh view."""
    for form in ("encoded", "pchar"):
        root = _table(tmp_path, value, form)
        paths = probe.polars_paths(root)
        assert paths["scanned"] != paths["dv"] and "%" in paths["dv"], (form, paths)
        assert _polars(root) == (ALL, ALL), form  # wrong rows, silently


@pytest.mark.parametrize("value", PLAIN, ids=repr)
def test_polars_applies_the_vector_only_without_an_escape(tmp_path, value):
    """Without escapes (``=`` and ``+`` written raw, as a URI path may hold them) Polars
    matches the vector; today's form escapes ``=``, so even these are read wrong."""
    root = _table(tmp_path, value, "pchar")
    paths = probe.polars_paths(root)
    assert paths["scanned"] == paths["dv"], paths
    assert _polars(root) == (LIVE, LIVE)
    assert _polars(_table(tmp_path, value, "encoded")) == (ALL, ALL)


def test_polars_fails_on_an_absolute_uri(tmp_path):
    """``file_uris()`` joins an absolute ``add.path`` to the root: an error, not rows -- also for
    a file without a vector, so absolute URIs would cost Polars the whole table."""
    root = _table(tmp_path, "x", "absolute")
    with pytest.raises(FileNotFoundError):
        pl.read_delta(root)


@pytest.mark.parametrize("value", ESCAPED + PLAIN, ids=repr)
def test_the_join_on_the_encoded_path_is_the_whole_cause(tmp_path, monkeypatch, value):
    """Polars' own callback, given the decoded ``filepath`` (what ``file_uris()`` holds),
    applies the vector on every path in today's form: nothing else in Polars ignores it."""
    from urllib.parse import unquote

    import polars.io.delta._dataset as ds

    original = ds._extract_delta_deletion_vectors

    def decoded(requested, vectors):
        return original(requested, vectors.with_columns(pl.col("filepath").map_elements(unquote, pl.String)))

    monkeypatch.setattr(ds, "_extract_delta_deletion_vectors", decoded)
    assert _polars(_table(tmp_path, value, "encoded")) == (LIVE, LIVE)


@pytest.mark.parametrize("root_name", ["my lake", "café", "50%off"])
def test_a_root_polars_cannot_name_is_an_error_not_rows(tmp_path, root_name):
    """A table root whose path holds a space, non-ASCII text or ``%``: ``file_uris()`` gives the
    root percent-encoded, which is no file, so Polars fails on the table (with or without
    vectors) rather than reading it; ``QueryBuilder`` reads it right."""
    root = str(tmp_path / root_name / "t")
    probe.write_table(root, "i", partition_path("region", "x"), "pchar")
    assert _query_builder(root) == LIVE
    with pytest.raises(FileNotFoundError):
        pl.read_delta(root)
