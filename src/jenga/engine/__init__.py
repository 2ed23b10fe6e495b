"""Reference engine: paged attention (torch) and model runners reading jenga's KV layout.

Kept import-free on purpose: ``import jenga.engine`` must not pull torch models or the manager.
"""
