"""The KV-cache manager's core, bottom-up: specs and records, alloc/, prefix/, policy/, evict/, manager/."""
