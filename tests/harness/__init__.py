"""The test harness: the torture generator and runner, the S3-compatible test server (moto on
loopback) and the Delta test readers. Used by the tests and by ``benchmarks/``; not part of the
installed package."""
