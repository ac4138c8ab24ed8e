"""The test harness: the torture generator and runner, the S3-compatible test server (moto on
loopback), the Delta test readers and the in-process CLI runner (:mod:`tests.harness.cli`). Used by the tests and by ``benchmarks/``; not part of the
installed package."""
