"""Notifiers (``BaseNotifier`` subclasses) for bucketindex tasks."""

from airflow_provider_bucketindex.notifications.shadow_compare import IndexMismatchNotifier

__all__ = ["IndexMismatchNotifier"]
