"""Index implementations: key hashing, the record-level index bucket store."""
