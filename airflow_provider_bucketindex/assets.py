"""The ``bucketindex`` Asset URI scheme: a table's identity in Airflow, whatever its spelling.

A table's Asset URI is ``bucketindex:`` followed by the table's storage location, normalised::

    bucketindex:s3://lake/events          <- s3a://lake/events, s3n://lake/events/, s3://key@lake/events?region=x
    bucketindex:file:///data/events       <- /data/events, file:///data/./events/, file://localhost/data/events
    bucketindex:file:///data/my%20events  <- /data/my events, file:///data/my%20events
    bucketindex:hdfs://nn:8020/lake/events

Why a scheme of its own: the same table is written as ``s3a://`` by Spark jobs, ``s3://`` by the
in-task engine and a user's DAG, with or without a trailing ``/``, with storage options in its
query; each spelling used to be a distinct Asset, so a DAG scheduled on one spelling missed the
events of another. Registered in the provider info (``asset-uris``), Airflow normalises every
``bucketindex:`` URI it meets -- ``Asset(uri=...)`` in a DAG file, an event's asset -- with
:func:`sanitize_uri`; :func:`create_asset` is the factory (hook lineage, ``table_asset``) and
:func:`convert_asset_to_openlineage` the OpenLineage converter.

The identity is the storage location only:

* ``s3a``/``s3n`` are ``s3``, ``gcs`` is ``gs``, ``abfss``/``az`` are ``abfs`` (one store,
  several client spellings: :data:`spark_jobs.io.storage.SCHEME_ALIASES`, the table layer's own map);
* the query (storage options: endpoint, region, credentials) and the fragment are not part of it:
  the same table reached through another endpoint setting is the same table, and an Asset URI is
  stored in the metadata DB and shown in the UI, so it must never carry a secret;
* a user part is dropped (an ``ObjectStoragePath``'s ``s3://conn_id@bucket/key`` names a
  connection, not a place), except where it is the location (``abfss://container@account``);
* a local path is percent-encoded, as a ``file://`` URI spells it (the table layer decodes a
  ``file://`` URI and reads a plain path literally); an object key is kept as written (the table
  layer does not decode it);
* a relative path is refused: the DAG processor, the scheduler, each worker and the triggerer
  would each resolve it against its own working directory. (A task that wrote a relative table
  knows where it wrote: the operators pass the absolute path they used.)

Imports no Airflow at module level (the ProvidersManager imports this module in every process
that builds a ``bucketindex:`` Asset) and nothing heavy.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, quote, unquote, urlsplit

from spark_jobs.exceptions import BadInputError
from spark_jobs.io.storage import SCHEME_ALIASES
from spark_jobs.redaction import redact_uri

if TYPE_CHECKING:
    from airflow.sdk import Asset

__all__ = [
    "SCHEME",
    "TableAssetUriError",
    "asset_uri",
    "convert_asset_to_openlineage",
    "create_asset",
    "openlineage_dataset",
    "sanitize_uri",
    "table_location",
]

#: the registered Asset URI scheme (provider info ``asset-uris``)
SCHEME = "bucketindex"
_PREFIX = SCHEME + ":"

#: schemes whose user part is the location (``container@account``), not a user or a connection
_USER_PART_IS_LOCATION = frozenset({"abfs", "wasb", "wasbs"})


class TableAssetUriError(BadInputError):
    """A table URI that names no definite location (a relative path, no bucket): it cannot be
    an Asset. A ``ValueError``, as Airflow expects of a URI normaliser."""


def table_location(table_uri: Any) -> str:
    """The normalised storage location of a table: the identity its Asset URI carries.

    ``table_uri`` is a path, a storage URI, an ``ObjectStoragePath`` or an Asset URI of this
    scheme (``bucketindex:...``, returned normalised)."""
    given = str(table_uri).strip()
    prefixed = given[:len(_PREFIX)].lower() == _PREFIX
    text = given[len(_PREFIX):] if prefixed else given
    if prefixed and text.startswith("//"):
        raise TableAssetUriError(
            f"{redact_uri(given)}: not a table's Asset URI; write {_PREFIX}<table location>, e.g. "
            f"{_PREFIX}s3://bucket/path or {_PREFIX}file:///abs/path")
    parts = urlsplit(text)
    if len(parts.scheme) <= 1:  # a plain path (or a Windows drive letter): a local table, read literally
        return "file://" + quote(_absolute(text, given=given), safe="/")
    scheme = SCHEME_ALIASES.get(parts.scheme.lower(), parts.scheme.lower())
    if scheme == "file":  # percent-encoded, as the table layer reads it (pyarrow decodes a file:// URI)
        if parts.netloc not in ("", "localhost"):
            raise TableAssetUriError(
                f"{redact_uri(given)}: file:// names the host {parts.netloc!r}; a local table is "
                f"file:///absolute/path (three slashes)")
        return "file://" + quote(_absolute(unquote(parts.path), given=given), safe="/")
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        if scheme in _USER_PART_IS_LOCATION:
            netloc = f"{user.partition(':')[0]}@{host}"  # the container; never a password
        else:
            netloc = host
    if not netloc:
        raise TableAssetUriError(f"{redact_uri(given)}: names no bucket or host; write {scheme}://bucket/path")
    return f"{scheme}://{netloc}{parts.path.rstrip('/')}"


def _absolute(path: str, *, given: str) -> str:
    if not path.startswith("/"):
        raise TableAssetUriError(
            f"{redact_uri(given)} is a relative path: a table's Asset needs an absolute path or a URI "
            f"(the DAG processor, the scheduler, the workers and the triggerer would each resolve it "
            f"against their own working directory)")
    path = posixpath.normpath(path)
    return "/" + path.lstrip("/")  # normpath keeps a leading '//'


def asset_uri(table_uri: Any) -> str:
    """The table's Asset URI: ``bucketindex:<normalised location>``."""
    return _PREFIX + table_location(table_uri)


def sanitize_uri(uri: SplitResult) -> SplitResult:
    """Airflow's normaliser of ``bucketindex:`` URIs (provider info ``asset-uris`` ``handler``).

    Airflow has split the URI, lower-cased the scheme, sorted the query and dropped the fragment
    and the trailing ``/``; this keeps the location only (:func:`table_location`). Raises
    ``ValueError`` (:class:`TableAssetUriError`) for a URI that names no definite location."""
    inner = uri.path
    if uri.netloc:
        inner = "//" + uri.netloc + inner  # 'bucketindex://...': refused by table_location, with the form
    return SplitResult(scheme=SCHEME, netloc="", path=table_location(inner), query="", fragment="")


def create_asset(*, table_uri: Any, extra: dict[str, Any] | None = None) -> Asset:
    """The table as an Airflow Asset (the ``asset-uris`` ``factory``; hook lineage calls it with
    ``scheme="bucketindex", asset_kwargs={"table_uri": ...}``).

    The name is the URI too, so two spellings of one table are one Asset (Airflow keys assets
    by name as well as by URI)."""
    from airflow.sdk import Asset

    uri = asset_uri(table_uri)
    return Asset(name=uri, uri=uri, extra=extra)


def openlineage_dataset(uri: Any) -> tuple[str, str]:
    """``(namespace, name)`` of a table's location or Asset URI, after the OpenLineage dataset
    naming spec: ``file`` + absolute path; ``s3://bucket`` + key; ``hdfs://host:port`` + path."""
    location = urlsplit(table_location(uri))
    if location.scheme == "file":
        return "file", unquote(location.path)
    if location.scheme in ("s3", "gs", "wasbs", "abfs"):
        return f"{location.scheme}://{location.netloc}", location.path.lstrip("/")
    return f"{location.scheme}://{location.netloc}", location.path or "/"


def convert_asset_to_openlineage(asset: Asset, lineage_context: Any) -> Any:
    """The OpenLineage dataset of a ``bucketindex:`` Asset (the ``asset-uris``
    ``to_openlineage_converter``): the table's storage location, named as
    :func:`openlineage_dataset` names it, so the Asset and the Spark job's own lineage meet."""
    from airflow.providers.common.compat.openlineage.facet import Dataset

    namespace, name = openlineage_dataset(asset.uri)
    return Dataset(namespace=namespace, name=name)
