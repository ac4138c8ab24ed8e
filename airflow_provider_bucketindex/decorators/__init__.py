"""TaskFlow decorators of the provider (registered under ``task-decorators`` in the provider info)."""
