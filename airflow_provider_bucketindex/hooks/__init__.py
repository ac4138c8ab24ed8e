"""Hooks: :class:`~airflow_provider_bucketindex.hooks.bucketindex.BucketIndexHook`."""
