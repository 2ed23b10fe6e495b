"""Eviction orders (lru, reuse) over cached pages, and whole-large-page eviction."""
