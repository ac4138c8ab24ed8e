"""The one URI redaction (:func:`spark_jobs.io.storage.redact_uri`, issue 36 item 5): which
parameters are secrets, in every spelling and encoding, and what stays readable."""

from __future__ import annotations

import pytest

from spark_jobs.exceptions import BadInputError, TableNotFoundError
from spark_jobs.io.storage import REDACTED, SECRET_OPTIONS, redact_uri, split_uri_options, uri_secrets

SECRET = "wJalr/XUtnFEMI+K7MDENG=bPxRfiCY"
ENCODED = "wJalr%2FXUtnFEMI%2BK7MDENG%3DbPxRfiCY"


@pytest.mark.parametrize("key", ["secret_access_key", "SECRET_ACCESS_KEY", "Secret_Access_Key", "aws_secret_access_key",
                                 "secret_key", "fs.s3a.secret.key", "s3.secret-access-key", "secret%5Faccess%5Fkey",
                                 "session_token", "token", "AWS_SESSION_TOKEN", "fs.s3a.session.token", "password"])
def test_every_spelling_of_a_secret_is_redacted(key):  # type: ignore[no-untyped-def]
    uri = f"s3://lake/t?endpoint_url=http%3A%2F%2F127.0.0.1%3A9000&{key}={ENCODED}&region=eu-west-1"
    out = redact_uri(uri)
    assert ENCODED not in out and "wJalr" not in out
    assert out == f"s3://lake/t?endpoint_url=http%3A%2F%2F127.0.0.1%3A9000&{key}={REDACTED}&region=eu-west-1"


def test_the_storage_options_secrets_are_the_uri_secrets():  # type: ignore[no-untyped-def]
    for key in SECRET_OPTIONS:
        assert redact_uri(f"s3://b/t?{key}=x") == f"s3://b/t?{key}={REDACTED}"
    # what says where, not how to get in, stays readable (as redacted() keeps it for options)
    kept = "s3://b/t?endpoint_url=https%3A%2F%2Fminio%3A9000&region=eu-west-1&access_key_id=AKIA1&profile=etl"
    assert redact_uri(kept) == kept


def test_several_uris_in_a_message_and_raw_values():  # type: ignore[no-untyped-def]
    msg = (f"upserting s3://src/x.parquet?secret_access_key={SECRET}&session_token=T0K into "
           f"'s3a://lake/t?SECRET_KEY={ENCODED}' (\"s3://o?token=abc\"), s3://p/q?a=1&password=pw;x")
    out = redact_uri(msg)
    for value in (SECRET, "T0K", ENCODED, "abc", "pw"):
        assert value not in out
    assert out == ("upserting s3://src/x.parquet?secret_access_key=***&session_token=*** into "
                   "'s3a://lake/t?SECRET_KEY=***' (\"s3://o?token=***\"), s3://p/q?a=1&password=***;x")
    assert redact_uri(out) == out  # idempotent
    assert sorted(uri_secrets(msg)) == sorted({SECRET, "T0K", ENCODED, SECRET.replace("+", " "), "abc", "pw"})


def test_user_part_and_spark_connect_parameters():  # type: ignore[no-untyped-def]
    assert redact_uri("s3://AKIA1:sec%2Fret@lake/t") == "s3://AKIA1:***@lake/t"
    assert redact_uri("sc://connect:15002/;user_id=etl;token=tok-123;use_ssl=true") == \
        "sc://connect:15002/;user_id=etl;token=***;use_ssl=true"
    for plain in ("/data/lake/t", "s3://lake/t", "sc://connect:15002", "a=b and c=d", "user@example.com", ""):
        assert redact_uri(plain) == plain


def test_a_redacted_or_user_part_uri_is_refused_in_one_line_without_the_secret():  # type: ignore[no-untyped-def]
    with pytest.raises(BadInputError, match=r"redacted"):
        split_uri_options(redact_uri(f"s3://lake/t?access_key_id=AK&secret_access_key={ENCODED}"))
    with pytest.raises(BadInputError, match=r"user part") as e:
        split_uri_options(f"s3://AK:{ENCODED}@lake/t")
    assert ENCODED not in str(e.value)
    assert split_uri_options(f"s3://lake/t?secret_access_key={ENCODED}")[1]["secret_access_key"] == SECRET


def test_our_errors_never_carry_a_uri_secret():  # type: ignore[no-untyped-def]
    e = TableNotFoundError(f"no bucketindex table at s3://lake/t?secret_access_key={ENCODED} (no table.json)")
    assert str(e) == "no bucketindex table at s3://lake/t?secret_access_key=*** (no table.json)"
