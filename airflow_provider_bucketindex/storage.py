"""Storage options for Airflow tasks: where an operator's store settings and credentials come from,
and how they reach the work without landing in a log, a command line or the metadata DB.

Why here and not in the hook: operators, sensors and triggers all need the same answer, and a
trigger runs in the triggerer, which rebuilds it from connection ids (its arguments are stored in
the metadata DB, so they must never carry a secret).

Where an option comes from, lowest first (each level replaces the ones below it key by key;
credentials -- key id, secret, token, or a profile -- come as one group from the highest level
that names a key id or a profile, as :mod:`spark_jobs.io.storage` does for its own levels):

1. the **storage connection** (``storage_conn_id``: the operator's argument -- or the connection of
   an ``ObjectStoragePath`` given as its table or source (:func:`use_object_storage_paths`) --, else
   the ``bucketindex`` connection's ``storage_conn_id`` extra). An ``aws`` connection goes through
   the **Amazon provider's hook** when ``apache-airflow-providers-amazon`` is installed (the
   ``amazon`` extra): ``AwsBaseHook.get_credentials()`` resolves its keys, ``role_arn`` (assumed
   through STS), profile or session kwargs into keys and a session token, and its
   ``AwsConnectionWrapper`` gives the S3 endpoint and the region (:func:`options_through_amazon_provider`).
   Without the provider (or for another connection type) it is read by hand as the provider reads
   one: login = access key id, password = secret access key, extras ``endpoint_url`` (or
   ``service_config.s3.endpoint_url``), ``region_name``, ``aws_session_token``, ``profile_name``,
   ``config_kwargs.s3.addressing_style`` (or ``addressing_style``); ``role_arn`` and the other
   assume-role extras are refused there (:func:`options_by_hand`);
2. the ``bucketindex`` connection's ``storage_options`` extra (a JSON object of
   :data:`spark_jobs.io.storage.KNOWN_OPTIONS` keys);
3. the operator's ``storage_options`` argument (templated).

The result is one dict of canonical options (:func:`spark_jobs.io.storage.normalise_options`:
an unknown key is bad input). Below all three, in every process, the environment and the SDK
default chain still apply (:class:`spark_jobs.io.storage.StorageConfig`).

How the options reach the work:

* in the task (Arrow engine, rollback, clean, sensors, the hook's table reads):
  :func:`storage_scope` sets them as the process's run options and restores the previous
  ones after; a lock serialises scopes, so two triggers with different stores in one
  triggerer never see each other's settings;
* a spark-submit or Spark Connect child process: the JSON in ``$BUCKETINDEX_STORAGE_OPTIONS``
  of its environment (:data:`spark_jobs.io.storage.OPTIONS_ENV`), never on its command line;
  the job then carries them into its Spark tasks.

Imports no Spark and no Spark provider (the triggerer imports this).
"""

from __future__ import annotations

import functools
import json
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, TypeVar

from spark_jobs.exceptions import BadInputError
from spark_jobs.io import storage

__all__ = [
    "CREDENTIAL_KEYS",
    "StorageCredentialsError",
    "StorageOptionsError",
    "amazon_base_hook",
    "check_no_secrets",
    "combine",
    "env_value",
    "extras_storage",
    "has_secrets",
    "is_object_storage_path",
    "mask",
    "merge_levels",
    "object_storage_location",
    "options_by_hand",
    "options_from_storage_connection",
    "options_through_amazon_provider",
    "parse_options",
    "resolve_options",
    "scoped",
    "storage_scope",
    "use_object_storage_paths",
]

#: options that travel as one group (a key id is never paired with another level's secret)
CREDENTIAL_KEYS = ("access_key_id", "secret_access_key", "session_token", "profile")

#: extras of an ``aws`` connection that bucketindex reads (the rest belong to the Amazon provider)
_AWS_EXTRAS = {
    "endpoint_url": "endpoint_url",
    "region_name": "region",
    "aws_session_token": "session_token",
    "aws_access_key_id": "access_key_id",
    "aws_secret_access_key": "secret_access_key",
    "profile_name": "profile",
}
#: extras of an ``aws`` connection that change how the Amazon provider authenticates: bucketindex
#: cannot honour them, and ignoring them silently would sign requests with other credentials
_AWS_UNSUPPORTED = ("role_arn", "assume_role_method", "assume_role_kwargs", "session_kwargs",
                    "external_id", "web_identity_token_file")

_T = TypeVar("_T")


class StorageOptionsError(BadInputError):
    """Storage options an operator, sensor or connection gives are not usable (an unknown key,
    a secret where it would be stored in the metadata DB). Bad input: retrying cannot help."""


def parse_options(value: Any, *, where: str) -> dict[str, str]:
    """``value`` (a dict, or its JSON text as a connection form stores it) as canonical options.

    ``where`` names the source in the one-line error (``connection 'x' extra 'storage_options'``)."""
    try:
        return storage.parse_options(value, where=where)
    except BadInputError as e:
        raise StorageOptionsError(str(e)) from None


def extras_storage(conn: Any) -> tuple[dict[str, str], str | None]:
    """``(storage_options, storage_conn_id)`` a ``bucketindex`` connection's extras name."""
    extra = conn.extra_dejson or {}
    options = parse_options(extra.get("storage_options"), where=f"connection {conn.conn_id!r} extra 'storage_options'")
    storage_conn_id = extra.get("storage_conn_id")
    return options, (str(storage_conn_id).strip() or None) if storage_conn_id not in (None, "") else None


#: the Amazon provider's module whose ``AwsBaseHook`` resolves an ``aws`` connection's credentials
AMAZON_HOOK_MODULE = "airflow.providers.amazon.aws.hooks.base_aws"
#: how a user gets that path (setup.cfg's extra)
AMAZON_EXTRA = "pip install 'airflow-provider-bucketindex[amazon]'"


class StorageCredentialsError(RuntimeError):
    """The Amazon provider could not resolve a storage connection's credentials (STS refused or
    unreachable, a profile missing): not bad input as such -- an STS outage passes -- so an
    ordinary, retried task failure."""


def amazon_base_hook() -> type | None:
    """``AwsBaseHook`` when the Amazon provider is installed, else None (then :func:`options_by_hand`)."""
    try:
        module = __import__(AMAZON_HOOK_MODULE, fromlist=["AwsBaseHook"])
    except ImportError:
        return None
    return getattr(module, "AwsBaseHook", None)


def options_from_storage_connection(conn: Any, *, log: Any = None) -> dict[str, str]:
    """The options of a storage connection: through the Amazon provider's hook for an ``aws``
    connection when the provider is installed (roles, ``role_arn``, profiles as the provider
    handles them), read by hand otherwise (the module docstring, level 1)."""
    hook_class = amazon_base_hook()
    if hook_class is not None and (conn.conn_type or "aws") == "aws":
        return options_through_amazon_provider(conn, hook_class=hook_class, log=log)
    return options_by_hand(conn, log=log)


def _credential_source(extra: Mapping[str, Any], conn: Any) -> bool:
    """Whether an ``aws`` connection names where its credentials come from (keys, a token, a
    profile, a role, session kwargs). Without one the SDK's default chain applies in every process
    that reaches the store, as it does without a connection -- nothing is frozen into options."""
    named = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token", "profile_name", "role_arn",
             "session_kwargs", "assume_role_method")
    return bool(conn.login or conn.password or any(extra.get(k) for k in named))


def options_through_amazon_provider(conn: Any, *, hook_class: type, log: Any = None) -> dict[str, str]:
    """An ``aws`` connection's options as the Amazon provider resolves them.

    The endpoint (``service_config.s3.endpoint_url``, else ``endpoint_url``) and the region come
    from its ``AwsConnectionWrapper``; when the connection names a credential source, the keys
    and session token come from ``AwsBaseHook.get_credentials()``: a ``role_arn`` is assumed
    through STS (its endpoint: ``service_config.sts.endpoint_url``, as the provider reads it), a
    ``profile_name`` read from the worker's AWS files. The result is frozen keys: temporary ones
    (an assumed role's) expire after their session's duration (STS default one hour;
    ``assume_role_kwargs.DurationSeconds`` sets it), which bounds a Spark job given them. Other
    store settings bucketindex knows (``addressing_style`` ...) are read as :func:`options_by_hand`
    reads them."""
    where = f"storage connection {conn.conn_id!r}"
    extra = dict(conn.extra_dejson or {})
    plain = {k: v for k, v in _hand_raw(conn, extra, where=where, log=log).items() if k not in CREDENTIAL_KEYS}
    hook = hook_class(aws_conn_id=conn.conn_id, client_type="s3")
    wrapper = hook.conn_config
    endpoint = wrapper.get_service_endpoint_url("s3")
    if endpoint:
        plain["endpoint_url"] = endpoint
    if wrapper.region_name:
        plain["region"] = wrapper.region_name
    if _credential_source(extra, conn):
        try:
            creds = hook.get_credentials()
        except Exception as e:  # STS, a profile, the network: the provider's own errors, one line
            raise StorageCredentialsError(
                f"{where}: the Amazon provider could not resolve its credentials: {' '.join(str(e).split())}"
            ) from None
        plain.update({"access_key_id": creds.access_key, "secret_access_key": creds.secret_key})
        if creds.token:
            plain["session_token"] = creds.token
        if log is not None:
            log.info("%s: credentials resolved by the Amazon provider's AwsBaseHook%s", where,
                     f" (role {wrapper.role_arn})" if wrapper.role_arn else "")
    try:
        return storage.normalise_options(plain)
    except BadInputError as e:
        raise StorageOptionsError(f"{where}: {e}") from None


def _hand_raw(conn: Any, extra: Mapping[str, Any], *, where: str, log: Any) -> dict[str, Any]:
    """The options an ``aws``-style connection spells, before normalising (no refusal here)."""
    raw: dict[str, Any] = {}
    service = extra.get("service_config")
    if isinstance(service, Mapping) and isinstance(service.get("s3"), Mapping) and service["s3"].get("endpoint_url"):
        raw["endpoint_url"] = service["s3"]["endpoint_url"]
    config_kwargs = extra.get("config_kwargs")
    if isinstance(config_kwargs, Mapping) and isinstance(config_kwargs.get("s3"), Mapping):
        style = config_kwargs["s3"].get("addressing_style")
        if style:
            raw["addressing_style"] = style
    for key, value in extra.items():
        if value in (None, "") or key in ("service_config", "config_kwargs"):
            continue
        canonical = _AWS_EXTRAS.get(key)
        if canonical is None:
            try:
                canonical = storage.parse_option(f"{key}=")[0]  # the key's canonical name, any spelling
            except BadInputError:
                if log is not None:
                    log.debug("%s: extra %r is not a storage option; left to its provider", where, key)
                continue
        raw.setdefault(canonical, value)
    if conn.login:
        raw["access_key_id"] = conn.login
    if conn.password:
        raw["secret_access_key"] = conn.password
    return raw


def options_by_hand(conn: Any, *, log: Any = None) -> dict[str, str]:
    """The options of a storage connection, read as the Amazon provider reads an ``aws`` one,
    without it (it is not installed, or the connection is of another type).

    Login and password are the access key id and secret; extras name the endpoint, region,
    token, profile and addressing style. Extras bucketindex does not know are left to the
    provider they belong to (a shared ``aws_default`` has many), except those that change
    which credentials sign requests (``role_arn`` ...), which are refused: honouring them
    partially would reach the store as someone else (the Amazon provider honours them)."""
    extra = dict(conn.extra_dejson or {})
    where = f"storage connection {conn.conn_id!r}"
    unsupported = [k for k in _AWS_UNSUPPORTED if extra.get(k)]
    if unsupported:
        raise StorageOptionsError(
            f"{where}: extra {', '.join(unsupported)} needs the Amazon provider's credentials ({AMAZON_EXTRA}); "
            f"without it bucketindex signs with the connection's keys, profile or the SDK's default chain")
    try:
        return storage.normalise_options(_hand_raw(conn, extra, where=where, log=log))
    except BadInputError as e:
        raise StorageOptionsError(f"{where}: {e}") from None


def merge_levels(*levels: Mapping[str, str] | None) -> dict[str, str]:
    """Options of several levels, lowest first: a higher level replaces a lower one key by key,
    and the credential group (key id, secret, token, or a profile) comes whole from the highest
    level naming a key id or a profile (:func:`spark_jobs.io.storage.layer`)."""
    present = [{k: v for k, v in level.items() if v not in (None, "")} for level in levels if level]
    return storage.layer(reversed(present))


def resolve_options(
    *,
    conn_id: str | None,
    storage_conn_id: str | None = None,
    storage_options: Mapping[str, Any] | str | None = None,
    get_connection: Callable[[str], Any] | None = None,
    default_conn_id: str | None = None,
    log: Any = None,
) -> dict[str, str]:
    """The merged options for a task of ``conn_id`` (see the module docstring for the order).

    ``default_conn_id`` undefined is no error (the embedded default: no storage settings), as the
    hook treats it; any other connection named and missing raises ``AirflowNotFoundException``."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    if get_connection is None:
        from airflow.sdk import BaseHook

        get_connection = BaseHook.get_connection
    conn_options: dict[str, str] = {}
    extra_storage_conn: str | None = None
    if conn_id:
        try:
            conn_options, extra_storage_conn = extras_storage(get_connection(conn_id))
        except AirflowNotFoundException:
            if conn_id != default_conn_id:
                raise
    task_options = parse_options(storage_options, where="storage_options")
    return combine(conn_options=conn_options, storage_conn_id=storage_conn_id or extra_storage_conn,
                   task_options=task_options, get_connection=get_connection, log=log)


def combine(*, conn_options: Mapping[str, str], storage_conn_id: str | None, task_options: Mapping[str, str],
            get_connection: Callable[[str], Any], log: Any = None) -> dict[str, str]:
    """The three levels merged: the storage connection's, the connection extra's, the task's."""
    from_storage_conn = (options_from_storage_connection(get_connection(storage_conn_id), log=log)
                         if storage_conn_id else {})
    return merge_levels(from_storage_conn, conn_options, task_options)


def has_secrets(options: Mapping[str, str] | None) -> bool:
    return any(options.get(k) for k in storage.SECRET_OPTIONS) if options else False


def check_no_secrets(options: Mapping[str, str] | None, *, what: str) -> None:
    """Refuse options that would store a secret where it must not be (a trigger's arguments)."""
    if has_secrets(options):
        names = ", ".join(sorted(k for k in storage.SECRET_OPTIONS if options and options.get(k)))
        raise StorageOptionsError(
            f"{what}: storage_options carries {names}, which a deferred task would store in the metadata DB; "
            f"put credentials in a connection (storage_conn_id, or the connection's storage_options extra)")


def check_uri_no_secrets(uri: Any, *, what: str) -> None:
    """Refuse a URI whose query or user part carries a secret where it would be stored (a
    trigger's arguments), as :func:`check_no_secrets` refuses such options."""
    if isinstance(uri, str) and storage.uri_secrets(uri):
        raise StorageOptionsError(
            f"{what}: {storage.redact_uri(uri)} carries credentials in its query, which a deferred task would "
            f"store in the metadata DB; put them in a connection (storage_conn_id, or the connection's "
            f"storage_options extra)")


def mask(options: Mapping[str, str] | None) -> None:
    """Register each secret value with Airflow's secrets masker: any log line that prints it
    (an exception text, a command, a JSON dump) shows ``***`` instead."""
    if not options:
        return
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - older task SDKs
        return
    for key in sorted(storage.SECRET_OPTIONS):
        value = options.get(key)
        if value:
            mask_secret(value, key)


def env_value(options: Mapping[str, str]) -> str:
    """The ``$BUCKETINDEX_STORAGE_OPTIONS`` value for a child process (JSON, keys sorted)."""
    return json.dumps(dict(options), sort_keys=True)


_scope_lock = threading.RLock()


@contextmanager
def storage_scope(options: Mapping[str, str] | None) -> Iterator[None]:
    """Run the body with ``options`` as this process's run options; the previous ones after.

    Nothing is changed for empty options (the worker's own environment and run options
    apply, as before). The lock is held for the whole body: run options are process-wide, and a
    triggerer polls many triggers from threads of one process."""
    if not options:
        yield
        return
    with _scope_lock:
        previous = storage.configured() or None
        wanted = dict(options)
        changed = previous != wanted
        if changed:
            storage.configure(wanted)
        try:
            yield
        finally:
            if changed:
                storage.configure(previous)


#: the operator attributes that name a table, a source or a report (a URI that may carry credentials)
URI_FIELDS = ("table_uri", "source_uri", "report_uri", "reports_dir")


def mask_uris(*uris: Any) -> None:
    """Register the secrets a URI's query or user part carries
    (:func:`spark_jobs.io.storage.uri_secrets`) with Airflow's secrets masker, as :func:`mask`
    does for options: a task log line, a rendered template field or an error that quotes the URI
    shows ``***``. What the provider stores itself (XCom, Asset URIs, lineage) is redacted with
    :func:`spark_jobs.io.storage.redact_uri` where it is built."""
    values = sorted({v for u in uris if isinstance(u, str) for v in storage.uri_secrets(u)})
    if not values:
        return
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - older task SDKs
        return
    for value in values:
        mask_secret(value, "uri_secret")


def is_object_storage_path(value: Any) -> bool:
    """Whether ``value`` is Airflow's ``ObjectStoragePath`` (without importing it: a value that
    is one was built by a process that imported its module already)."""
    module = sys.modules.get("airflow.sdk.io.path")
    return module is not None and isinstance(value, module.ObjectStoragePath)


def object_storage_location(value: Any) -> tuple[Any, str | None]:
    """``(plain location, connection id)`` of an ``ObjectStoragePath``; any other value as it is,
    with None.

    Why: ``str()`` of ``ObjectStoragePath("s3://bucket/key", conn_id="lake")`` is
    ``s3://lake@bucket/key``, and the table layer would read ``lake@bucket`` as the bucket. The
    path's own parts are used instead: ``s3://bucket/key`` (the key as written: object keys are
    not percent-decoded), a local path as a plain path (read literally), and the connection id
    apart -- the caller makes it the storage connection. A local path has no connection."""
    if not is_object_storage_path(value):
        return value, None
    protocol = value.protocol
    if isinstance(protocol, (tuple, list)):
        protocol = protocol[0]
    protocol = str(protocol or "file").lower()
    if protocol in ("file", "local"):
        return str(value.path), None
    return f"{protocol}://{value.path}", (str(value.conn_id).strip() or None) if value.conn_id else None


def use_object_storage_paths(op: Any, fields: tuple[str, ...] = ("table_uri", "source_uri")) -> None:
    """Replace the ``ObjectStoragePath`` values of ``op``'s ``fields`` by their plain locations and
    make their connection ``op.storage_conn_id`` (:func:`object_storage_location`).

    One task reaches one store with one set of options (the in-task engine's run options, the
    Spark job's environment), so paths naming two connections, or a connection other than the
    task's ``storage_conn_id``, are bad input (``AirflowFailException``: no retry can fix them)."""
    conns: dict[str, str] = {}
    for name in fields:
        value = getattr(op, name, None)
        location, conn_id = object_storage_location(value)
        if location is not value:
            setattr(op, name, location)
        if conn_id:
            conns[name] = conn_id
    if not conns:
        return
    given = getattr(op, "storage_conn_id", None)
    given = str(given).strip() if given not in (None, "") else None
    wanted = set(conns.values()) | ({given} if given else set())
    if len(wanted) > 1:
        from airflow.sdk.exceptions import AirflowFailException

        named = ", ".join(f"{name}: {conn!r}" for name, conn in sorted(conns.items()))
        raise AirflowFailException(
            f"ObjectStoragePath connections disagree ({named}{f', storage_conn_id: {given!r}' if given else ''}): "
            f"one task reaches its table and its source with one storage connection")
    conn_id = wanted.pop()
    if conn_id != given:
        op.storage_conn_id = conn_id
        op.__dict__.pop("hook", None)  # a hook built before would hold the old storage connection


def scoped(method: Callable[..., _T]) -> Callable[..., _T]:
    """Decorate an operator method (``execute``): run it inside ``self.storage_scope()``, with the
    secrets of its URIs (:data:`URI_FIELDS`, rendered by now) masked in its logs. An
    ``ObjectStoragePath`` table or source is made a plain location first, its connection the
    task's storage connection (:func:`use_object_storage_paths`)."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> _T:
        use_object_storage_paths(self)
        mask_uris(*(getattr(self, name, None) for name in URI_FIELDS))
        with self.storage_scope():
            return method(self, *args, **kwargs)

    return wrapper
