"""shadow-compare's pure-Python half: which options and index/--against pairs are refused, and
the deterministic sample and fingerprint labels the Spark job reproduces."""

from __future__ import annotations

import pytest

from spark_jobs.exceptions import BadInputError
from spark_jobs.index.hashing import fingerprint
from spark_jobs.table.shadow import ShadowOptions, check_options, fingerprint_label, in_sample, sample_cutoff


@pytest.mark.parametrize("index, against", [
    ("record", "scan"), ("record", "global_simple"), ("record", "bucket"),
    ("bucket", "scan"), ("bucket", "global_simple"), ("global_simple", "scan"),
])
def test_sensible_pairs_are_accepted(index, against):
    check_options(index, ShadowOptions(against=against))


@pytest.mark.parametrize("index, against", [("bucket", "bucket"), ("global_simple", "global_simple"),
                                            ("global_simple", "bucket")])
def test_pairs_that_compare_nothing_are_refused(index, against):
    with pytest.raises(BadInputError, match="--against"):
        check_options(index, ShadowOptions(against=against))


@pytest.mark.parametrize("opts", [ShadowOptions(sample_fraction=0), ShadowOptions(sample_fraction=1.01),
                                  ShadowOptions(max_mismatches=-1), ShadowOptions(since="yesterday"),
                                  ShadowOptions(against="hash")])
def test_bad_options_are_refused(opts):
    with pytest.raises(BadInputError):
        check_options("record", opts)


def test_sample_is_deterministic_and_about_the_fraction():
    keys = [f"key-{i}" for i in range(4000)]
    picked = [k for k in keys if in_sample(k, 0.25)]
    assert picked == [k for k in keys if in_sample(k, 0.25)]
    assert 800 < len(picked) < 1200
    assert all(in_sample(k, 1.0) for k in keys[:100]) and sample_cutoff(1.0) == 2**32


def test_fingerprint_label_is_the_hex_of_the_128_bit_fingerprint():
    hi, lo = fingerprint("k é/%")
    assert fingerprint_label("k é/%") == f"fp:{hi:016x}{lo:016x}"
    assert len(fingerprint_label("x")) == 3 + 32
