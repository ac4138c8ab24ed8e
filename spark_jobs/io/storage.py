"""One storage configuration, from which every client of a store is built.

A table on object storage is touched by two clients: a pyarrow filesystem (reads, writes,
listings) and, on S3, a boto3 client for the one request pyarrow cannot make (a conditional
``PutObject``, the commit point) and for batch deletes. Both must reach the same endpoint with
the same credentials, or a commit lands in another store than its data. So both are built
here, from one :class:`StorageConfig`, resolved once per (URI, options) and cached with the
:class:`~spark_jobs.io.filesystem.FileIO` that holds them.

Where a setting comes from, highest first (docs/format.md §10, README "Object storage"):

1. the URI's query (``s3://bucket/t?endpoint_url=http://127.0.0.1:9000&region=eu-west-1``);
2. the run's options: ``--storage-option KEY=VALUE`` on the CLI, or an operator's
   ``storage_options`` over its Airflow connection's extras;
3. ``$BUCKETINDEX_STORAGE_OPTIONS`` (a JSON object; how an operator hands its options to the
   processes it starts, off their command lines);
4. the environment (``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, ``AWS_REGION``/
   ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
   ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``);
5. the AWS SDKs' own default chain (shared config files, instance or pod roles).

Credentials are one group: the key id, secret and token come together from the highest source
that names a key id (a key id from the command line is never paired with a secret from the
environment); a ``profile`` applies only when no key id is given at that level or above.

Spark executors do not share the driver's environment on a cluster: the jobs carry the
driver's resolved options to every task (:func:`carried` / :func:`adopt`, called where
``spark_jobs.kernels.tasks.bind`` carries fault settings), inside the task's pickled closure,
never on a command line or in Spark's configuration.

Kept free of ``pyspark`` and ``airflow``; ``boto3`` is imported only when an S3 store is used.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import parse_qsl, urlsplit

from spark_jobs.exceptions import BadInputError, MissingDependencyError
from spark_jobs.redaction import REDACTED, SECRET_ALIASES, SECRET_OPTIONS, redact_uri, uri_secrets

__all__ = [
    "OPTIONS_ENV",
    "SCHEME_ALIASES",
    "KNOWN_OPTIONS",
    "SECRET_OPTIONS",
    "StorageConfig",
    "configure",
    "on_configure",
    "configured",
    "carried",
    "adopt",
    "parse_option",
    "parse_options",
    "layer",
    "normalise_options",
    "split_uri_options",
    "redacted",
    "redact_uri",
    "uri_secrets",
    "REDACTED",
]

#: the environment variable through which a parent process (an Airflow operator) hands its
#: storage options to a child (spark-submit, the CLI): a JSON object, kept off command lines
OPTIONS_ENV = "BUCKETINDEX_STORAGE_OPTIONS"

#: URI schemes that name the same store as another (Hadoop's S3 connectors' schemes). Here, not in
#: :mod:`spark_jobs.io.filesystem` (which uses it): the Airflow provider's Asset identity uses it
#: too, and must not import pyarrow to get it
SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3", "gcs": "gs", "abfss": "abfs", "az": "abfs"}

#: canonical option -> what it sets
KNOWN_OPTIONS: dict[str, str] = {
    "endpoint_url": "the S3 endpoint, e.g. http://127.0.0.1:9000 (default: AWS for the region)",
    "region": "the bucket's region (default: the SDK's, else us-east-1)",
    "access_key_id": "the access key id (with secret_access_key)",
    "secret_access_key": "the secret access key (masked in logs)",
    "session_token": "a temporary credential's session token (masked in logs)",
    "profile": "a named profile of the shared AWS config files",
    "addressing_style": "path, virtual or auto (default auto: virtual on AWS, path on a custom endpoint)",
}
#: accepted spellings (other tools' names for the same settings) -> canonical
_ALIASES: dict[str, str] = {
    "endpoint": "endpoint_url",
    "endpoint_override": "endpoint_url",
    "aws_endpoint_url": "endpoint_url",
    "aws_endpoint_url_s3": "endpoint_url",
    "s3.endpoint": "endpoint_url",
    "fs.s3a.endpoint": "endpoint_url",
    "region_name": "region",
    "aws_region": "region",
    "aws_default_region": "region",
    "s3.region": "region",
    "fs.s3a.endpoint.region": "region",
    "access_key": "access_key_id",
    "aws_access_key_id": "access_key_id",
    "s3.access-key-id": "access_key_id",
    "fs.s3a.access.key": "access_key_id",
    **SECRET_ALIASES,  # the secrets' spellings: spark_jobs.redaction, which hides them
    "profile_name": "profile",
    "aws_profile": "profile",
}
_CREDENTIALS = ("access_key_id", "secret_access_key", "session_token")
_ADDRESSING = ("path", "virtual", "auto")
#: environment variable -> option, first match wins per option
_ENV: tuple[tuple[str, str], ...] = (
    ("AWS_ENDPOINT_URL_S3", "endpoint_url"),
    ("AWS_ENDPOINT_URL", "endpoint_url"),
    ("AWS_REGION", "region"),
    ("AWS_DEFAULT_REGION", "region"),
    ("AWS_ACCESS_KEY_ID", "access_key_id"),
    ("AWS_SECRET_ACCESS_KEY", "secret_access_key"),
    ("AWS_SESSION_TOKEN", "session_token"),
    ("AWS_PROFILE", "profile"),
)

_lock = threading.Lock()
#: this process's run options (CLI ``--storage-option``, an operator's); None: not configured
_configured: dict[str, str] | None = None


def _canonical(key: str) -> str:
    k = key.strip().lower()
    k = _ALIASES.get(k, k)
    if k not in KNOWN_OPTIONS:
        raise BadInputError(f"unknown storage option {key!r}; known: {', '.join(KNOWN_OPTIONS)}")
    return k


def normalise_options(options: Mapping[str, Any] | None) -> dict[str, str]:
    """``options`` with canonical keys and string values; an unknown key or a bad value is bad input."""
    out: dict[str, str] = {}
    for key, value in (options or {}).items():
        if value is None:
            continue
        k = _canonical(str(key))
        v = str(value).strip()
        if k == "addressing_style" and v.lower() not in _ADDRESSING:
            raise BadInputError(f"storage option addressing_style={v!r}: expected one of {', '.join(_ADDRESSING)}")
        if k == "endpoint_url" and v and "://" not in v:
            v = "https://" + v  # boto3 needs a scheme; pyarrow's endpoint_override takes either form
        out[k] = v.lower() if k == "addressing_style" else v
    return out


def parse_option(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--storage-option`` (argparse ``type=``)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise BadInputError(f"--storage-option {text!r}: expected KEY=VALUE (keys: {', '.join(KNOWN_OPTIONS)})")
    return _canonical(key), value


def split_uri_options(uri: str) -> tuple[str, dict[str, str]]:
    """``uri`` without its query, and the storage options the query names.

    Only URIs with a scheme carry options: a local path may contain ``?`` literally.
    """
    parts = urlsplit(uri)
    if len(parts.scheme) <= 1:
        return uri, {}
    if parts.password:  # never sent on as part of a bucket name, never printed
        raise BadInputError(f"credentials in the user part of {redact_uri(uri)} are not read: give them as "
                            f"?access_key_id=...&secret_access_key=... or --storage-option")
    if not parts.query:
        return uri, {}
    options = normalise_options(dict(parse_qsl(parts.query, keep_blank_values=True)))
    if any(options.get(k) == REDACTED for k in SECRET_OPTIONS):
        raise BadInputError(f"{uri.split('?', 1)[0]}: the URI's credentials were redacted ({REDACTED}) where it was "
                            f"printed or stored; give the secret itself (or --storage-option)")
    return uri.split("?", 1)[0], options


def _env_options(env: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for var, key in _ENV:
        value = env.get(var)
        if value and key not in out:
            out[key] = value
    return normalise_options(out)


def parse_options(value: Any, *, where: str) -> dict[str, str]:
    """``value`` -- a mapping, or its JSON text (an environment variable, a connection form's
    extra) -- as canonical options; BadInputError naming ``where`` otherwise."""
    if value is None or value == "" or value == {}:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise BadInputError(f"{where} is not a JSON object of storage options: {e}") from None
    if not isinstance(value, Mapping):
        raise BadInputError(f"{where} must be a JSON object of storage options, got {type(value).__name__}")
    try:
        return normalise_options(value)
    except BadInputError as e:
        raise BadInputError(f"{where}: {e}") from None


def _env_json(env: Mapping[str, str]) -> dict[str, str]:
    return parse_options(env.get(OPTIONS_ENV), where=f"${OPTIONS_ENV}")


def layer(levels: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """Merge option levels, highest first; credentials come as one group from one level (the
    highest naming a key id or a profile): a secret is never paired with another level's key id."""
    merged: dict[str, str] = {}
    creds_from: Mapping[str, str] | None = None
    for level in levels:
        for k, v in level.items():
            if k in _CREDENTIALS or k == "profile":
                continue
            merged.setdefault(k, v)
        if creds_from is None and ("access_key_id" in level or "profile" in level):
            creds_from = level
    if creds_from is not None:
        if "access_key_id" in creds_from:
            for k in _CREDENTIALS:
                if creds_from.get(k):
                    merged[k] = creds_from[k]
        else:
            merged["profile"] = creds_from["profile"]
    return merged


def redacted(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` fit for a log line: secrets replaced by ``***``."""
    return {k: (REDACTED if k in SECRET_OPTIONS and v else v) for k, v in options.items()}


@dataclass(frozen=True)
class StorageConfig:
    """The resolved settings of one store; hashable, so the FileIO built from it is cached."""

    options: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @classmethod
    def resolve(cls, *, uri_options: Mapping[str, str] | None = None, options: Mapping[str, str] | None = None,
                env: Mapping[str, str] | None = None) -> "StorageConfig":
        """The settings for one URI: its query over the run's options over the environment."""
        env = os.environ if env is None else env
        # four levels, not three: $BUCKETINDEX_STORAGE_OPTIONS is a level of its own under the run's
        # options, so a key id given on the command line is never paired with a secret from it
        run = normalise_options(configured() if options is None else options)
        merged = layer([normalise_options(uri_options), run, _env_json(env), _env_options(env)])
        return cls(tuple(sorted(merged.items())))

    @property
    def values(self) -> dict[str, str]:
        return dict(self.options)

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def __repr__(self) -> str:  # never print a secret by accident
        return f"StorageConfig({redacted(self.values)})"

    # -- what the clients are built with ------------------------------------------------
    def _credentials(self) -> tuple[str | None, str | None, str | None, str | None]:
        """(access key, secret, token, region from a profile): a profile is resolved once, through
        boto3, so pyarrow and boto3 sign with the same keys."""
        v = self.values
        if v.get("access_key_id"):
            return v.get("access_key_id"), v.get("secret_access_key"), v.get("session_token"), None
        if v.get("profile"):
            from botocore.exceptions import ProfileNotFound

            try:
                session = _boto3().Session(profile_name=v["profile"])
            except ProfileNotFound as e:  # a name the user gave, not the store's state: one line, exit 2
                raise BadInputError(f"storage profile {v['profile']!r} is not in the shared AWS config files "
                                    f"($AWS_CONFIG_FILE, $AWS_SHARED_CREDENTIALS_FILE, ~/.aws)") from e
            creds = session.get_credentials()
            if creds is None:
                raise BadInputError(f"storage profile {v['profile']!r} has no credentials")
            frozen = creds.get_frozen_credentials()
            return frozen.access_key, frozen.secret_key, frozen.token, session.region_name
        return None, None, None, None

    def s3_filesystem(self) -> Any:
        """A ``pyarrow.fs.S3FileSystem`` for these settings.

        ``check_directory_existence_before_creation`` stays off and nothing here creates
        directory markers: an object store has no directories, and every marker is a request.
        """
        import pyarrow.fs as pafs

        v = self.values
        key, secret, token, profile_region = self._credentials()
        kwargs: dict[str, Any] = {}
        if key:
            kwargs.update(access_key=key, secret_key=secret or "", session_token=token)
        region = v.get("region") or profile_region
        if region:
            kwargs["region"] = region
        endpoint = v.get("endpoint_url")
        if endpoint:
            parts = urlsplit(endpoint)
            kwargs["endpoint_override"] = parts.netloc + parts.path.rstrip("/")
            kwargs["scheme"] = parts.scheme or "https"
        style = v.get("addressing_style", "auto")
        if style == "virtual":
            kwargs["force_virtual_addressing"] = True
        return pafs.S3FileSystem(**kwargs)

    def s3_client(self) -> Any:
        """A boto3 S3 client for the same endpoint, region and credentials as :meth:`s3_filesystem`."""
        boto3 = _boto3()
        from botocore.config import Config

        v = self.values
        key, secret, token, profile_region = self._credentials()
        style = v.get("addressing_style", "auto")
        if style == "auto" and v.get("endpoint_url"):
            style = "path"  # what pyarrow does on a custom endpoint: both clients name objects alike
        config = Config(s3={"addressing_style": style}, retries={"mode": "standard", "max_attempts": 5},
                        # not every S3-compatible store answers boto3's default CRC checksums
                        request_checksum_calculation="when_required",
                        response_checksum_validation="when_required")
        session = boto3.session.Session()
        return session.client("s3", endpoint_url=v.get("endpoint_url") or None,
                              region_name=v.get("region") or profile_region or None,
                              aws_access_key_id=key, aws_secret_access_key=secret, aws_session_token=token,
                              config=config)


def _boto3() -> Any:
    try:
        import boto3
    except ImportError as e:  # pragma: no cover - boto3 is a declared dependency
        raise MissingDependencyError(
            "tables on s3:// need boto3 for their commit point (a conditional PutObject): pip install boto3"
        ) from e
    return boto3


# -- the run's options, and carrying them to Spark tasks ---------------------------------
def configure(options: Mapping[str, Any] | None) -> None:
    """Set this process's run options (``--storage-option``, an operator's); None clears them."""
    global _configured
    with _lock:
        _configured = None if options is None else normalise_options(options)
    for forget in _ON_CONFIGURE:
        forget()


#: what to forget when the run's options change: :mod:`spark_jobs.io.filesystem` (which imports
#: this module, so this one does not import it) registers its FileIO cache's ``clear_cache``
_ON_CONFIGURE: list[Callable[[], None]] = []


def on_configure(forget: Callable[[], None]) -> None:
    """Call ``forget`` whenever :func:`configure` changes the run's options (a cache of clients
    built from the old ones). The registry keeps this module below the FileIOs in the import
    graph: a module-level import of :mod:`spark_jobs.io.filesystem` here would be a cycle."""
    if forget not in _ON_CONFIGURE:
        _ON_CONFIGURE.append(forget)


def configured() -> dict[str, str]:
    return dict(_configured or {})


def carried() -> dict[str, str] | None:
    """The driver's options for the tasks it starts: its run options over its environment's, so an
    executor on another machine reaches the same store with the same credentials."""
    options = layer([configured(), _env_json(os.environ), _env_options(os.environ)])
    return options or None


def adopt(options: dict[str, str] | None) -> None:
    """In a task: take exactly the driver's options (a reused worker keeps none of an earlier task's)."""
    if (options or None) == (_configured or None):
        return
    configure(options)


def _after_fork_in_child() -> None:
    """A fresh lock in a forked child (one another thread held at the fork would never be released)."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
