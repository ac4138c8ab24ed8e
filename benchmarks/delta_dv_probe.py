"""Which Delta readers apply deletion vectors (issue 39 item 2: measured, not assumed).

Writes a tiny Delta table by hand whose one data file (4 rows) carries a deletion vector that
drops rows 1 and 3 -- inline (storage type ``i``, Z85) or in a DV file (``u``... is path-based:
``p`` here) -- in the form the Delta protocol gives ("Deletion Vector Format": the
RoaringBitmapArray portable serialization, magic 1681511377), with the ``deletionVectors``
reader feature, then reads it with each reader installed and prints what each returns:
the 2 live rows (applies DVs), all 4 (ignores them: wrong rows), or a refusal. The file is in
the root, then in a ``region=x`` directory (its ``add.path`` percent-encoded, as every
partitioned table's is). Measured (deltalake 1.6.6, Polars 2.1.0): ``to_pyarrow_table`` and
``to_pyarrow_dataset`` refuse, ``QueryBuilder`` applies them, Polars applies them on a plain
path and ignores them on the encoded one.

Then (the second part of the output, the *forms*) the same inline-DV file in each partition
directory the product writes (``layout.partition_path``: a value's Java-URL-encoded form, so a
space is ``+`` and ``/``, ``%``, ``+``, ``~``, non-ASCII, a leading ``__`` are ``%XX``, null is
``__NULL__``, a long value a prefix, ``~`` and a hash), its ``add.path`` written in each form a
writer could choose: ``encoded`` (``quote(rel)``, today's form: ``=`` as ``%3D``), ``pchar``
(only what a URI path segment may not hold raw is escaped: ``=``, ``+``, ``*`` stay), ``raw``
(no escaping; not a URI when the name holds ``%``) and ``absolute`` (``file://`` URI). For
each it prints what ``QueryBuilder`` and Polars return and the two strings Polars compares (see
below). Why Polars ignores the vector (polars 2.1.0, ``polars/io/delta/_dataset.py``):
``DeltaDataset.to_dataset_scan`` scans ``DeltaTable.file_uris()`` -- the table root joined
with the *decoded* ``add.path`` -- and its callback ``_extract_delta_deletion_vectors`` finds a
file's vector by a left join, on exact string equality, of those paths with the ``filepath``
column of ``DeltaTable.deletion_vectors()`` -- a URL, still *percent-encoded* -- after
stripping only ``file://``. A path holding any escape never matches, the join yields a null
selection vector, and the file is read whole: silently, the deleted rows included. Measured:
every form is right in Polars exactly when the written ``add.path`` holds no ``%XX`` escape; a
directory name that holds ``%`` (every value outside ``[A-Za-z0-9*._-]`` and space) needs
``%25`` in any URI form, so no relative form is right for it; an absolute URI makes Polars
fail (``file_uris()`` joins it to the root: FileNotFoundError). ``QueryBuilder`` reads every
URI form right.

    python benchmarks/delta_dv_probe.py [--dir /tmp/dvprobe]

Only ``layout.partition_path`` (the directory names) comes from bucketindex: this is the evidence for format.md §11's and §12's reader table.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import shutil
import struct
import uuid
import zlib
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85(data: bytes) -> str:
    """Z85 (the Delta protocol's inline DV encoding), zero-padded to a multiple of 4 bytes."""
    data = data + b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(data), 4):
        v = int.from_bytes(data[i:i + 4], "big")
        chunk = []
        for _ in range(5):
            v, r = divmod(v, 85)
            chunk.append(_Z85[r])
        out.append("".join(reversed(chunk)))
    return "".join(out)


def roaring_array(rows: list[int]) -> bytes:
    """The Delta RoaringBitmapArray portable form of ``rows`` (all < 2**16, <= 4096 of them:
    one 32-bit bitmap, key 0, holding one array container)."""
    rows = sorted(rows)
    assert rows and rows[-1] < 2**16 and len(rows) <= 4096
    bitmap = struct.pack("<II", 12346, 1)  # SERIAL_COOKIE_NO_RUNCONTAINER, 1 container
    bitmap += struct.pack("<HH", 0, len(rows) - 1)  # key, cardinality - 1
    bitmap += struct.pack("<I", len(bitmap) + 4)  # offset of the container
    bitmap += struct.pack(f"<{len(rows)}H", *rows)
    return struct.pack("<i", 1681511377) + struct.pack("<q", 1) + struct.pack("<i", 0) + bitmap


#: what a URI path may hold raw besides unreserved characters (RFC 3986 pchar and ``/``)
PCHAR = "/=+*~!$&'(),;:@"
#: the ``add.path`` forms a writer could choose (module docstring)
FORMS = ("encoded", "pchar", "raw", "absolute")


def add_path(root: str, rel: str, form: str) -> str:
    """``rel`` (relative to ``root``, as on disk) as ``add.path`` in ``form``."""
    if form == "encoded":
        return quote(rel, safe="/")
    if form == "pchar":
        return quote(rel, safe=PCHAR)
    if form == "raw":
        return rel
    if form == "absolute":
        return "file://" + quote(posixpath.join(os.path.abspath(root), rel), safe=PCHAR)
    raise ValueError(form)


def write_table(root: str, storage: str, directory: str = "", form: str = "encoded") -> None:
    """The probe table; its file in ``directory`` (e.g. ``region=x``: its ``add.path`` in the
    default ``encoded`` form is then ``region%3Dx/part-0.parquet``, as a partitioned table's
    paths are today), its ``add.path`` in ``form`` (:func:`add_path`)."""
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "_delta_log"))
    os.makedirs(os.path.join(root, directory), exist_ok=True)
    data = pa.table({"id": pa.array([0, 1, 2, 3], pa.int64()), "v": pa.array(["a", "b", "c", "d"])})
    rel = posixpath.join(directory, "part-0.parquet") if directory else "part-0.parquet"
    pq.write_table(data, os.path.join(root, rel))
    blob = roaring_array([1, 3])
    if storage == "i":
        dv = {"storageType": "i", "pathOrInlineDv": z85(blob), "sizeInBytes": len(blob), "cardinality": 2}
    else:
        path = os.path.join(root, f"deletion_vector_{uuid.uuid4()}.bin")
        with open(path, "wb") as f:  # format version 1, then size (BE), the DV, its CRC-32 (BE)
            f.write(b"\x01" + struct.pack(">i", len(blob)) + blob + struct.pack(">I", zlib.crc32(blob)))
        dv = {"storageType": "p", "pathOrInlineDv": "file://" + path, "offset": 1, "sizeInBytes": len(blob),
              "cardinality": 2}
    schema = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}},
                                           {"name": "v", "type": "string", "nullable": True, "metadata": {}}]}
    actions = [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                      "writerFeatures": ["deletionVectors"]}},
        {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                      "schemaString": json.dumps(schema), "partitionColumns": [],
                      "configuration": {"delta.enableDeletionVectors": "true"}, "createdTime": 0}},
        {"add": {"path": add_path(root, rel, form), "partitionValues": {},
                 "size": os.path.getsize(os.path.join(root, rel)),
                 "modificationTime": 0, "dataChange": True, "stats": json.dumps({"numRecords": 4}),
                 "deletionVector": dv}},
    ]
    with open(os.path.join(root, "_delta_log", f"{0:020d}.json"), "w") as f:
        f.write("".join(json.dumps(a) + "\n" for a in actions))


def readers(root: str) -> dict[str, object]:
    out: dict[str, object] = {}

    def attempt(name: str, fn: object) -> None:
        try:
            t = fn()  # type: ignore[operator]
            out[name] = sorted(t.column("id").to_pylist())
        except Exception as e:  # noqa: BLE001 - a refusal is a result
            out[name] = f"refused: {type(e).__name__}: {str(e).splitlines()[0][:120]}"

    import deltalake

    attempt(f"deltalake {deltalake.__version__} to_pyarrow_table",
            lambda: deltalake.DeltaTable(root).to_pyarrow_table())
    attempt(f"deltalake {deltalake.__version__} to_pyarrow_dataset",
            lambda: deltalake.DeltaTable(root).to_pyarrow_dataset().to_table())
    attempt(f"deltalake {deltalake.__version__} QueryBuilder (DataFusion)",
            lambda: pa.table(deltalake.QueryBuilder().register("t", deltalake.DeltaTable(root))
                             .execute("select * from t")))
    try:
        import polars as pl

        attempt(f"polars {pl.__version__} read_delta", lambda: pl.read_delta(root).to_arrow())
        attempt(f"polars {pl.__version__} scan_delta", lambda: pl.scan_delta(root).collect().to_arrow())
    except ImportError:
        pass
    try:
        import duckdb

        def duck() -> pa.Table:
            con = duckdb.connect()
            con.execute("LOAD delta")  # no network here: only if the extension is installed
            return con.execute(f"select * from delta_scan('{root}')").to_arrow_table()

        attempt(f"duckdb {duckdb.__version__} delta_scan", duck)
    except ImportError:
        pass
    return out


def partition_dirs() -> list[tuple[str, str]]:
    """``(value, directory)`` for values whose directory names cover every character class the
    product writes (:func:`spark_jobs.table.layout.partition_path`)."""
    from spark_jobs.table.layout import partition_path

    values: list[str | None] = ["x", "a b", "a+b", "a/b", "a%b", "café", "日本", None, "", "__NULL__",
                                "a*b~c", "x" * 300, "é" * 120, "-12.50", "2024-03-31"]
    return [(repr(v) if v is None or len(v) < 20 else f"{v[:3]!r}*{len(v)}", partition_path("region", v))
            for v in values]


def polars_paths(root: str) -> dict[str, str]:
    """The two strings Polars 2.1's ``_extract_delta_deletion_vectors`` joins on: the scanned
    path (``file_uris()``) and the deletion vector's ``filepath`` with ``file://`` stripped."""
    import deltalake

    t = deltalake.DeltaTable(root)
    dv = pa.RecordBatchReader.from_stream(t.deletion_vectors()).read_all().column("filepath").to_pylist()
    return {"scanned": t.file_uris()[0], "dv": dv[0].removeprefix("file://")}


def forms(base: str) -> list[dict[str, object]]:
    """The forms matrix (module docstring): one row per (directory, form)."""
    import deltalake
    import polars as pl

    rows = []
    for value, directory in partition_dirs():
        for form in FORMS:
            root = os.path.join(base, form, uuid.uuid5(uuid.NAMESPACE_URL, directory).hex)
            write_table(root, "i", directory, form)
            got: dict[str, object] = {}
            for name, fn in (("QueryBuilder", lambda: pa.table(deltalake.QueryBuilder().register(
                    "t", deltalake.DeltaTable(root)).execute("select id from t"))),
                             ("polars read_delta", lambda: pl.read_delta(root).to_arrow())):
                try:
                    got[name] = sorted(fn().column("id").to_pylist())
                except Exception as e:  # noqa: BLE001 - a refusal is a result
                    got[name] = f"refused: {type(e).__name__}"
            try:
                paths = polars_paths(root)
                match = paths["scanned"] == paths["dv"]
            except Exception as e:  # noqa: BLE001
                paths, match = {"error": type(e).__name__}, None
            with open(os.path.join(root, "_delta_log", f"{0:020d}.json")) as f:
                path = [json.loads(line)["add"]["path"] for line in f if '"add"' in line][0]
            rows.append({"value": value, "form": form, "add.path": path, "polars_join_matches": match,
                         "got": got, **({"paths": paths} if match is False else {})})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/tmp/dvprobe")
    args = p.parse_args()
    for storage, directory in (("i", ""), ("p", ""), ("i", "region=x")):
        root = os.path.join(args.dir, f"dv_{storage}_{directory.replace('=', '_')}")
        write_table(root, storage, directory)
        print(json.dumps({"storage": storage, "directory": directory, "want": [0, 2], "got": readers(root)}))
    rows = forms(os.path.join(args.dir, "forms"))
    for row in rows:
        print(json.dumps(row, ensure_ascii=False))
    for form in FORMS:  # the summary: which forms are right in both readers for every directory
        mine = [r for r in rows if r["form"] == form]
        wrong = [r["value"] for r in mine if r["got"]["polars read_delta"] == [0, 1, 2, 3]]
        refused = [r["value"] for r in mine if str(r["got"]["polars read_delta"]).startswith("refused")]
        qb_ok = sum(r["got"]["QueryBuilder"] == [0, 2] for r in mine)
        print(json.dumps({"form": form, "QueryBuilder right": f"{qb_ok}/{len(mine)}",
                          "polars right": f"{len(mine) - len(wrong) - len(refused)}/{len(mine)}",
                          "polars wrong rows": wrong, "polars refused": refused}, ensure_ascii=False))


if __name__ == "__main__":
    main()
