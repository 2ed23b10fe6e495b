"""``KVCacheManager`` and the parts it is made of."""
