"""The cache-correctness oracle in jenga's engine (``tests/engine_cache_oracle.py``): for every tiny family and
every feature it takes (plain, speculative draft, host tier, images, salts), a seeded trace of
requests sharing prefixes over three rounds, under a budget that preempts and evicts, gives the same
tokens (logits to 2e-3) with prefix caching on and off, no hit past what the trace allows, and hits,
preemptions and evictions (host hits, image hits) in the caching-on run.

The fast slice (``make test``): salts on full attention, the host tier and a draft on a Mamba hybrid
(tiny Jamba); the whole grid (every family x feature, two seeds) is marked slow;
``benchmarks/cache_oracle.py`` runs the grid with vLLM's side and prints the per-family table.
"""

from __future__ import annotations

import pytest
from engine_cache_oracle import FAMILIES, HitLedger, check, supported

FAST = [("tiny-llama", "salts"), ("tiny-jamba", "host"), ("tiny-jamba", "spec")]


@pytest.mark.parametrize("family,feature", FAST)
def test_caching_on_equals_off(family, feature):
    res = check(family, feature, seed=0)
    assert res.equal == res.total


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("family,feature", [(f, x) for f in FAMILIES for x in supported(f)])
def test_every_family_and_feature(family, feature, seed):
    check(family, feature, seed=seed)


def test_every_tiny_family_runs_every_feature_it_takes():
    # a VLM takes no draft (refused at start); every other family takes every feature but images
    assert all(supported(f) == ("plain", "spec", "host", "salts") for f in FAMILIES
               if f not in ("tiny-gemma3-vision", "tiny-mllama"))
    assert len(FAMILIES) >= 20


def test_the_hit_ledger_flags_a_hit_across_salts_images_or_before_its_source():
    from types import SimpleNamespace as NS

    from jenga.core.request import ImageRef

    def lookups(cross, *seqs):
        ledger = HitLedger(cross)
        for rid, (tokens, salt, images, hit) in enumerate(seqs):
            ledger.note_lookup(NS(request_id=rid, tokens=tokens, cache_salt=salt, images=images, num_computed=hit))
        return ledger.violations()

    x, y = [5] * 40, [5] * 32 + [6] * 8
    assert lookups(False, (x, "a", (), 0), (x, "a", (), 32), (y, "a", (), 32)) == []
    assert lookups(False, (x, "a", (), 0), (x, "b", (), 32)) == [  # another salt's pages
        "request 1 (salt 'b') hit 32 tokens; a request of its salt admitted before it shares at most 0"]
    assert lookups(False, (x, "a", (), 16), (x, "a", (), 0))[0].startswith("request 0")  # nothing before it
    img = [9] * 20
    p, q = (ImageRef(4, 16, "p"),), (ImageRef(4, 16, "q"),)
    assert lookups(False, (img, None, p, 0), (img, None, q, 16)) == [
        "request 1 (salt None) hit 16 tokens; a request of its salt admitted before it shares at most 4"]
    # a cross-attention model: text before an image reads it, so even that needs the same image
    assert lookups(False, (img, None, p, 0), (img, None, q, 4)) == []
    assert len(lookups(True, (img, None, p, 0), (img, None, q, 4))) == 1
    # its placeholder is one token standing for encoder tokens outside the sequence (tiny Mllama: 40)
    enc = (ImageRef(1, 40, "p"),)
    assert lookups(True, ([5, 6, 7], None, enc, 0), ([5, 6, 7, 8], None, enc, 3)) == []
