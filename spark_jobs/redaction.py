"""Hiding the secrets a URI or a message can carry: the pure rules, importing nothing of the project.

Every error bucketindex raises (:class:`~spark_jobs.exceptions.BucketIndexError`) and every URI
a run stores, logs or prints goes through :func:`redact_uri`. It lives apart from
:mod:`spark_jobs.io.storage` (which re-exports every name here) so that
:mod:`spark_jobs.exceptions`, which :mod:`spark_jobs.io` imports, can import it without an import
cycle (``tests/unit/test_layering.py``).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

__all__ = ["REDACTED", "SECRET_OPTIONS", "SECRET_ALIASES", "redact_uri", "uri_secrets"]

#: what a secret is replaced with, in options and in URIs
REDACTED = "***"

#: the storage options (:data:`spark_jobs.io.storage.KNOWN_OPTIONS`) whose values are secrets
SECRET_OPTIONS = frozenset({"secret_access_key", "session_token"})

#: other tools' spellings of :data:`SECRET_OPTIONS` -> the canonical name (part of the storage
#: options' accepted spellings, ``spark_jobs.io.storage._ALIASES``)
SECRET_ALIASES: dict[str, str] = {
    "secret_key": "secret_access_key",
    "aws_secret_access_key": "secret_access_key",
    "s3.secret-access-key": "secret_access_key",
    "fs.s3a.secret.key": "secret_access_key",
    "token": "session_token",
    "aws_session_token": "session_token",
    "s3.session-token": "session_token",
    "fs.s3a.session.token": "session_token",
}


#: parameter names that hold a secret in other URIs a run may print (a Spark Connect URL's
#: ``;token=``, a presigned or SAS URL's signature, a database URL's password), beside every
#: spelling of :data:`SECRET_OPTIONS`
_SECRET_PARAMS = frozenset({"password", "passwd", "pwd", "secret", "signature", "sig", "x-amz-signature",
                            "x-amz-security-token", "client_secret", "sas_token", "api_key", "apikey"})
#: ``?key=value``, ``&key=value`` (a query) and ``;key=value`` (Spark Connect's parameters): the value
#: runs to the next separator, or to what ends a URI inside a message (space, quote, bracket)
_PARAM = re.compile(r"(?P<sep>[?&;])(?P<key>[^=&;?#\s'\"<>()\[\]{}]+)=(?P<value>[^&;#\s'\"<>()\[\]{}]*)")
#: the password of a URI's user part: ``scheme://user:password@host``
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s'\"]*):(?P<password>[^@\s'\"]*)@")


def _is_secret_param(key: str) -> bool:
    k = unquote(key).strip().lower()
    return SECRET_ALIASES.get(k, k) in SECRET_OPTIONS or k in _SECRET_PARAMS


def redact_uri(text: str) -> str:
    """``text`` -- a URI, or a message naming URIs -- with every secret a URI can carry replaced
    by ``***``: the value of a query or ``;`` parameter whose name is a secret storage option
    (:data:`SECRET_OPTIONS`, in any spelling :func:`spark_jobs.io.storage.normalise_options`
    accepts and any case) or another secret's usual name (:data:`_SECRET_PARAMS`), and the
    password of a user part.

    The one redaction of URIs: what a run stores (a plan's ``source``, a report), logs or
    prints, and every error it raises (:class:`~spark_jobs.exceptions.BucketIndexError`) goes
    through it, as ``--storage-option`` values go through
    :func:`spark_jobs.io.storage.redacted`. The store, the region and the key id stay readable
    (they say where, not how to get in). A redacted URI is refused if given back
    (:func:`spark_jobs.io.storage.split_uri_options`), never sent to a store with ``***`` for a
    secret.
    """
    if not text or ("=" not in text and "@" not in text):
        return text

    def param(m: "re.Match[str]") -> str:
        if not m.group("value") or not _is_secret_param(m.group("key")):
            return m.group(0)
        return f"{m.group('sep')}{m.group('key')}={REDACTED}"

    text = _PARAM.sub(param, text)
    return _USERINFO.sub(lambda m: f"{m.group('head')}:{REDACTED}@" if m.group("password") else m.group(0), text)


def uri_secrets(text: str) -> list[str]:
    """The secret values :func:`redact_uri` hides in ``text``, each as written and decoded (for a
    log masker that matches literal values, e.g. Airflow's)."""
    found: list[str] = []
    for m in _PARAM.finditer(text or ""):
        if m.group("value") and _is_secret_param(m.group("key")):
            found += [m.group("value"), unquote(m.group("value").replace("+", " ")), unquote(m.group("value"))]
    for m in _USERINFO.finditer(text or ""):
        if m.group("password"):
            found += [m.group("password"), unquote(m.group("password"))]
    return sorted({v for v in found if v and v != REDACTED})
