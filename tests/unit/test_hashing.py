"""Key hashing: the bucket hash must match Spark's xxhash64, fingerprints must match XXH3-128."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import xxhash

from spark_jobs.index.hashing import (
    BUCKET_HASH_SEED,
    bucket_hash,
    bucket_of,
    buckets_of,
    composite_key,
    fingerprint,
    fingerprints,
)

pytestmark = pytest.mark.unit

KEYS = ["", "a", "key-1", "0f8fad5b-d9cb-469f-a165-70867728950e", "ключ", "鍵", "🔑", "a,b", "x\\y", " "]
UNICODE_KEYS = ["ключ", "鍵", "🔑", "Grüße", "e\u0301"]  # the last is 'e' + combining accent (not NFC-folded)


def _spark_xxhash64(key: str) -> int:
    """Independent model of Spark's xxhash64(string): XXH64 of the UTF-8 bytes, seed 42, signed."""
    v = xxhash.xxh64_intdigest(key.encode("utf-8"), 42)
    return v - (1 << 64) if v >= (1 << 63) else v


def test_xxh64_reference_vector() -> None:
    # The published XXH64 test vector (empty input, seed 0), to make sure the library is XXH64.
    assert xxhash.xxh64_intdigest(b"", 0) == 0xEF46DB3751D8E999


def test_seed_is_sparks() -> None:
    assert BUCKET_HASH_SEED == 42


@pytest.mark.parametrize("key", KEYS)
def test_bucket_hash_is_signed_xxh64(key: str) -> None:
    assert bucket_hash(key) == _spark_xxhash64(key)
    assert -(1 << 63) <= bucket_hash(key) < (1 << 63)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 100, 1000, 2**31 - 1])
def test_bucket_of_is_python_mod_of_signed_hash(n: int) -> None:
    for key in KEYS:
        assert bucket_of(key, n) == _spark_xxhash64(key) % n


def test_signed_interpretation_matters() -> None:
    # Keys whose unsigned XXH64 is >= 2^63 are negative for Spark; pmod of the signed value
    # differs from mod of the unsigned value for bucket counts that are not powers of two.
    keys = [f"k{i}" for i in range(200)]
    negative = [k for k in keys if xxhash.xxh64_intdigest(k.encode(), 42) >= 1 << 63]
    assert negative, "expected some keys with a negative signed hash"
    differs = [k for k in negative if bucket_of(k, 7) != xxhash.xxh64_intdigest(k.encode(), 42) % 7]
    assert differs
    for k in negative:
        assert bucket_hash(k) < 0
        assert bucket_of(k, 7) == _spark_xxhash64(k) % 7


def test_bucket_of_non_negative_and_in_range() -> None:
    rng = random.Random(7)
    keys = [f"{rng.getrandbits(64):x}-{i}" for i in range(5000)]
    for n in (1, 2, 3, 10, 64, 97, 1024, 10007):
        bs = buckets_of(keys, n)
        assert bs.dtype == np.int64
        assert ((bs >= 0) & (bs < n)).all()
        assert bs.tolist() == [bucket_of(k, n) for k in keys]
        if n >= 10:
            assert np.unique(bs).size > min(n, len(keys)) // 2  # actually spreads keys


def test_buckets_of_empty() -> None:
    assert buckets_of([], 8).size == 0


def test_composite_key_single_field_is_the_value() -> None:
    assert composite_key(["abc"]) == "abc"
    assert composite_key([42]) == "42"
    assert composite_key(["a,b\\c"]) == "a,b\\c"


def test_composite_key_separates_fields_that_a_naive_join_confuses() -> None:
    assert ",".join(("a,b", "c")) == ",".join(("a", "b,c"))  # the naive join collides
    assert composite_key(("a,b", "c")) != composite_key(("a", "b,c"))
    assert composite_key(("a\\", "b")) != composite_key(("a", "\\b"))
    assert composite_key(("a\\", ",b")) != composite_key(("a\\,", "b"))
    assert composite_key(("a", "b")) == "a,b"
    assert composite_key(("a,b", "c")) == "a\\,b,c"
    assert composite_key(("a\\", "b")) == "a\\\\,b"


@pytest.mark.parametrize("arity", [2, 3])
def test_composite_key_is_injective_for_a_fixed_arity(arity: int) -> None:
    # Every tuple of short strings over the troublesome alphabet encodes differently.
    values = ["".join(p) for n in range(3) for p in itertools.product("a,\\", repeat=n)]
    seen: dict[str, tuple[str, ...]] = {}
    for tup in itertools.product(values, repeat=arity):
        enc = composite_key(tup)
        assert seen.setdefault(enc, tup) == tup, f"{tup!r} and {seen[enc]!r} both encode as {enc!r}"


def test_fingerprints_match_xxh3_128() -> None:
    keys = KEYS + [f"key-{i}" for i in range(1000)]
    hi, lo = fingerprints(keys)
    assert hi.dtype == np.uint64 and lo.dtype == np.uint64
    assert hi.flags.c_contiguous and lo.flags.c_contiguous
    assert hi.size == lo.size == len(keys)
    for k, h, l in zip(keys, hi.tolist(), lo.tolist()):
        v = xxhash.xxh3_128_intdigest(k.encode("utf-8"))
        assert (h, l) == (v >> 64, v & ((1 << 64) - 1))
        assert fingerprint(k) == (h, l)


def test_fingerprints_are_distinct_for_distinct_keys() -> None:
    keys = [f"key-{i}" for i in range(20000)]
    hi, lo = fingerprints(keys)
    assert np.unique(np.stack([hi, lo], axis=1), axis=0).shape[0] == len(keys)
    assert np.unique(hi).size == len(keys)


def test_fingerprints_empty() -> None:
    hi, lo = fingerprints([])
    assert hi.size == 0 and lo.size == 0
    assert hi.dtype == np.uint64 and lo.dtype == np.uint64


@pytest.mark.parametrize("key", UNICODE_KEYS)
def test_unicode_keys_hash_as_their_utf8_bytes(key: str) -> None:
    raw = key.encode("utf-8")
    assert len(raw) > len(key)  # really multi-byte
    v = xxhash.xxh3_128_intdigest(raw)
    hi, lo = fingerprints([key])
    assert (int(hi[0]), int(lo[0])) == (v >> 64, v & ((1 << 64) - 1))
    u = xxhash.xxh64_intdigest(raw, 42)
    assert bucket_hash(key) == (u - (1 << 64) if u >= 1 << 63 else u)
    assert bucket_of(key, 13) == _spark_xxhash64(key) % 13
    # different normalization forms are different keys (no silent folding)
    if key == "e\u0301":
        assert fingerprint(key) != fingerprint("\u00e9")
