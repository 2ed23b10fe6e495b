"""The host tier: a second tier of KV pages in host memory, its copy plans and the lookup view over both tiers."""
