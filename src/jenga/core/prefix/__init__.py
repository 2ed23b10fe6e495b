"""Prefix caching's keys: block hashing, the hash memo, the prefix index and its KV events."""
