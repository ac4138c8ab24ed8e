"""Support for testing the product as a user would run it (fault injection)."""
