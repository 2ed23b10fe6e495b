"""A CRC-32 per manager (jenga and the baselines) of every answer on a seeded trace: proves a
refactoring of the core or the baselines changed no page.

``vs_vllm_manager.py --checksum`` covers jenga's manager on the benchmark's traces; this covers
every manager ``make_manager`` names, on a small seeded loop (prompts sharing prefixes, decodes,
frees, allocations that fail under a small pool) over a sliding-window model, a hybrid one and a
full-attention one.  Each allocate's page tables, each lookup's hit and the stats after every
step go into the CRC.  Run it on the code before and after a change and compare:

    PYTHONPATH=src python benchmarks/managers_checksum.py
"""

from __future__ import annotations

import random
import zlib

from jenga.baselines import MANAGER_NAMES, make_manager
from jenga.core.specs import ModelSpec

MODELS = (("gemma-3-12b", "3GiB"), ("jamba-1.5-mini", "6GiB"), ("llama-3.1-8b", "2GiB"))


def checksum(name: str, model: str, memory: str, seed: int = 7, steps: int = 400) -> int:
    """The CRC of manager ``name`` serving the seeded loop on ``model`` with ``memory`` of KV."""
    mgr = make_manager(name, ModelSpec.from_hf_config(model), memory)
    rng = random.Random(seed)
    crc = 0
    prefixes = [[rng.randrange(1, 30000) for _ in range(rng.randrange(16, 2000))] for _ in range(6)]
    live: dict[int, int] = {}
    next_id = 0
    for _ in range(steps):
        if len(live) < 6 and rng.random() < 0.5:  # a new request: a shared prefix, then its own tokens
            prompt = rng.choice(prefixes)[:rng.randrange(1, 2000)] + \
                [rng.randrange(1, 30000) for _ in range(rng.randrange(1, 300))]
            rid, next_id = next_id, next_id + 1
            mgr.add_request(rid, prompt)
            hit = mgr.lookup(rid)
            tables = mgr.allocate(rid, len(prompt) - hit)
            crc = zlib.crc32(f"{rid} {hit} {tables!r}".encode(), crc)
            if tables is None:
                mgr.free(rid)
            else:
                mgr.append_tokens(rid, [rng.randrange(1, 30000)])
                live[rid] = 0
        for rid in list(live):  # each running request decodes a token, or leaves
            if rng.random() < 0.1 or live[rid] > 60:
                mgr.free(rid)
                del live[rid]
                crc = zlib.crc32(f"free {rid}".encode(), crc)
                continue
            tables = mgr.allocate(rid, 1)
            crc = zlib.crc32(f"{rid} {tables!r}".encode(), crc)
            if tables is None:
                mgr.free(rid)
                del live[rid]
                continue
            mgr.append_tokens(rid, [rng.randrange(1, 30000)])
            live[rid] += 1
        crc = zlib.crc32(repr(mgr.stats()).encode(), crc)
    mgr.check_integrity()
    return crc


def main() -> None:
    for name in MANAGER_NAMES:
        for model, memory in MODELS:
            print(f"{name} {model}: {checksum(name, model, memory):08x}", flush=True)


if __name__ == "__main__":
    main()
