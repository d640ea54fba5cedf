"""Readers and writers of every file format a user brings (and the bundled data)."""
