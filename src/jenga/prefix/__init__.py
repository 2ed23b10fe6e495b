"""Prefix caching: block hashing, per-kind policies and the prefix-subset evictor."""
