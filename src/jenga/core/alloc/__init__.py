"""The LCM allocator: large pages carved into small pages, the free pool, run-level page moves."""
