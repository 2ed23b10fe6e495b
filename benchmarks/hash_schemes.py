"""Block-hash schemes for a 16-token page, timed on the same ~100k blocks (no model, no vLLM).

``chain`` is jenga's (``jenga.core.prefix.index``: one BLAKE2b call per block over the parent
digest and the block's tokens).  ``anchorG`` hashes every G-th block only; the G - 1 blocks after
an anchor are keyed by the anchor's digest followed by their tokens as raw bytes (still exact:
equal keys mean an equal prefix), so fewer hash calls but longer dict keys.  Each scheme is timed
on hashing, on inserting every key into a dict (registering pages) and on probing that dict with
another request's equal keys (a lookup); the median of ``--repeat`` runs.

    .venv/bin/python benchmarks/hash_schemes.py --blocks 102500
"""

from __future__ import annotations

import argparse
import statistics
import time
from hashlib import blake2b

import numpy as np

ROOT = bytes(16)
_BLANK = blake2b()


def chain(parts: list[bytes]) -> list[bytes]:
    out, parent, fresh = [], ROOT, _BLANK.copy
    append = out.append
    for part in parts:
        h = fresh()
        h.update(parent)
        h.update(part)
        append(parent := h.digest()[:16])
    return out


def anchored(group: int):
    def keys(parts: list[bytes]) -> list[bytes]:
        out, parent, fresh = [], ROOT, _BLANK.copy
        append = out.append
        for i in range(0, len(parts) // group * group, group):
            key = parent
            for part in parts[i:i + group - 1]:
                key = key + part
                append(key)
            h = fresh()
            h.update(key)
            h.update(parts[i + group - 1])
            append(parent := h.digest()[:16])
        return out
    return keys


def time_scheme(fn, parts: list[bytes], repeat: int) -> tuple[float, float, float]:
    hashing, insert, probe = [], [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        keys = fn(parts)
        t1 = time.perf_counter()
        table = dict(zip(keys, range(len(keys)), strict=True))
        t2 = time.perf_counter()
        again = fn(parts)  # another request's own, equal key objects
        t3 = time.perf_counter()
        assert all(map(table.__contains__, again))
        t4 = time.perf_counter()
        hashing.append(t1 - t0)
        insert.append(t2 - t1)
        probe.append(t4 - t3)
    return tuple(1e3 * statistics.median(x) for x in (hashing, insert, probe))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=102_500, help="16-token blocks (Jamba long: ~103k)")
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args(argv)
    tokens = np.random.default_rng(0).integers(0, 32_000, a.blocks * 16, dtype=np.uint32)
    parts = np.frombuffer(tokens.astype("<u4").tobytes(), dtype="V64").tolist()
    base = None
    print("scheme   hash ms  insert ms  probe ms  total ms  vs chain")
    for name, fn in [("chain", chain), ("anchor2", anchored(2)), ("anchor4", anchored(4)), ("anchor8", anchored(8))]:
        h, i, q = time_scheme(fn, parts, a.repeat)
        total = h + i + q
        base = base or total
        print(f"{name:8s} {h:7.1f}  {i:9.1f}  {q:8.1f}  {total:8.1f}  {total / base:7.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
