"""A seeded slice of the vLLM adapter fuzz (``tests/vllm_adapter_fuzz.py``): ``JengaKVCacheAdapter``
driven by the calls vLLM's scheduler makes, in its order, on every layout (full, sliding, chunked,
Mamba), with and without jenga's host tier and speculative lookahead; ``check_integrity()``, the
worker's block tables, live and shared block ids, byte overlap and KV events after every operation,
no page held at the end.  ``JENGA_ADAPTER_FUZZ_OPS`` operations (default 10,000: with the manager
fuzz's 90,000, 10^5 in ``make test``); ``python benchmarks/op_fuzz_long.py`` is the long run."""

from __future__ import annotations

import os

from vllm_adapter_fuzz import LAYOUTS, configurations, fuzz

OPS = int(float(os.environ.get("JENGA_ADAPTER_FUZZ_OPS", "10000")))


def test_seeded_adapter_fuzz():
    done, violations, seen = fuzz(OPS, 0, runs_of=OPS // (2 * len(configurations())) or 1)
    assert not violations, "\n".join(violations[:3])
    assert done == OPS and seen["ops"] == done
    # what the slice exercised: every layout, hits, shared blocks, preemptions, rejected drafts, host copies
    assert all(seen[f"runs:vllm {layout}"] > 0 for layout in LAYOUTS), dict(seen)
    for what in ("hit tokens", "shared blocks", "preempted", "drafts rejected", "copies", "events removed", "reset"):
        assert seen[what] > 0, (what, dict(seen))
