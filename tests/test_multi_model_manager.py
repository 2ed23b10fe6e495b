"""``MultiModelManager``: several models in one pool, scoped requests, per-model keys and floors."""

from __future__ import annotations

import dataclasses
import random

import pytest
from conftest import group, mamba, model, sliding

from jenga.core.manager.multi_model import MultiModelManager, composite_spec
from jenga.core.pagesize import PageSizeError, with_base_page
from jenga.core.specs import FullAttentionSpec, LayerGroup, ModelSpec, SlidingWindowSpec
from jenga.errors import InsufficientMemoryError, InvalidArgumentError


def named(spec: ModelSpec, name: str) -> ModelSpec:
    """``spec`` renamed, its cache specs naming the model too."""
    groups = tuple(dataclasses.replace(g, spec=dataclasses.replace(g.spec, model=name)) for g in spec.groups)
    return ModelSpec(name, groups, spec.max_model_len, spec.num_layers)


def full(heads: int = 1):
    return FullAttentionSpec("toy", num_kv_heads=heads, head_dim=32)


A = named(model(group("full", full(), 2), max_len=64), "a")  # 256 B pages
B = named(model(group("sliding", sliding(8), 3), group("full", full(), 1, first_layer=3), max_len=64), "b")
H = named(model(group("full", full(), 1), group("state", mamba(16, state_elems=64), 3, first_layer=1),
                max_len=64), "h")


LCM = with_base_page(composite_spec((A, B)), 4).large_page_bytes
SMALL_FLOORS = {"a": 1, "b": 2 * LCM}  # one large page for a, two for b (one per group)


def pool(models=(A, B), num_large: int = 12, **kw) -> MultiModelManager:
    lcm = with_base_page(composite_spec(models), 4).large_page_bytes
    mgr = MultiModelManager(models, (num_large + 1) * lcm, tokens_per_page=4, fit_pages=False, **kw)
    assert mgr.pool.num_large_pages == num_large
    return mgr


def serve(mgr, rid, model_name, prompt, n_out=2, *, salt=None, free=True) -> int:
    mgr.add_request(rid, prompt, model=model_name, cache_salt=salt)
    hit = mgr.lookup(rid)
    assert mgr.allocate(rid, len(prompt) - hit) is not None
    mgr.append_tokens(rid, [7])
    for _ in range(n_out - 1):
        assert mgr.allocate(rid, 1) is not None
        mgr.append_tokens(rid, [7])
    mgr.check_integrity()
    if free:
        mgr.free(rid)
        mgr.check_integrity()
    return hit


def test_requests_touch_only_their_models_groups():
    mgr = pool()
    serve(mgr, "x", "a", list(range(10, 30)), free=False)
    serve(mgr, "y", "b", list(range(10, 30)), free=False)
    scope_of = {g.name.split("/")[0] for g in mgr.model.groups}
    assert scope_of == {"a", "b"}
    for rid, own in (("x", "a"), ("y", "b")):
        req = mgr.requests[rid]
        for g, gs in zip(mgr.model.groups, req.groups, strict=True):
            held = mgr.policies[mgr.model.groups.index(g)].footprint.references(gs)
            assert bool(held) == g.name.startswith(own + "/"), (rid, g.name, held)
    assert mgr.model_used_bytes("a") > 0 and mgr.model_used_bytes("b") > 0
    assert mgr.model_used_bytes("a") + mgr.model_used_bytes("b") == mgr.used_bytes


def test_prefix_cache_is_per_model_and_per_salt():
    mgr = pool()
    prompt = list(range(10, 34))
    assert serve(mgr, 1, "a", prompt) == 0
    assert serve(mgr, 2, "b", prompt) == 0  # the same tokens cached by a: no hit for b
    keys = [set(mgr.index.table[g]) for g in range(len(mgr.model.groups))]
    assert keys[0] and keys[2] and not keys[0] & keys[2]  # a/full and b/full: the model is in every key
    assert serve(mgr, 3, "a", prompt) == 20  # a's own cache: whole pages below the last token
    assert serve(mgr, 4, "b", prompt) > 0
    assert serve(mgr, 5, "a", prompt, salt="t") == 0  # a salt still separates tenants
    assert serve(mgr, 6, "a", prompt, salt="t") == 20


def test_memory_follows_the_load_without_floors_in_the_way():
    mgr = pool(num_large=12, floors=SMALL_FLOORS)
    # model a alone can fill the whole pool: no static split
    n = 0
    while True:
        mgr.add_request(n, list(range(100 + n, 112 + n)), model="a")
        mgr.lookup(n)
        if mgr.allocate(n, 12) is None:
            mgr.free(n)
            break
        n += 1
    assert mgr.admission.held_large()[0] == 10  # all but b's two-page floor
    mgr.check_integrity()


def _flood(mgr, model_name: str, tag: int = 0) -> int:
    """Admit 12-token requests of ``model_name`` until one is refused; how many were admitted."""
    n = 0
    while True:
        rid = (model_name, tag, n)
        mgr.add_request(rid, [3 + (n + i + 50 * tag) % 400 for i in range(12)], model=model_name)
        if mgr.allocate(rid, 12 - mgr.lookup(rid)) is None:
            mgr.free(rid)
            return n
        n += 1


def test_under_contention_an_admission_stays_within_the_even_share():
    """While b has requests waiting, a's admissions stop at half the pool (what a static even
    split would give it); once b's queue is empty, a takes the rest; a's running requests still
    grow past the share."""
    mgr = pool(num_large=12, floors=SMALL_FLOORS)
    mgr.note_waiting("b", 3)
    _flood(mgr, "a")
    assert mgr.admission.held_large()[0] == 6  # 12 // 2
    for rid in [r for r in mgr.requests if r[0] == "a"][:2]:  # a running request grows past it
        for _ in range(8):
            mgr.append_tokens(rid, [5])
            assert mgr.allocate(rid, 1) is not None
    assert mgr.admission.held_large()[0] > 6
    mgr.note_waiting("b", 0)
    _flood(mgr, "a", tag=1)
    assert mgr.admission.held_large()[0] == 10  # all but b's two-page floor
    mgr.check_integrity()
    with pytest.raises(InvalidArgumentError, match="unknown model 'c'"):
        mgr.note_waiting("c", 1)
    with pytest.raises(InvalidArgumentError):
        mgr.note_waiting("a", -1)


def test_floor_holds_under_a_flood_at_one_model():
    mgr = pool(num_large=12, max_model_lens={"a": 64, "b": 40})
    fa, fb = mgr.floor_pages
    assert fb == mgr.peak_large_pages(1, 40) and fa == mgr.peak_large_pages(0, 64)
    flood = 0
    while True:  # model a floods the pool: 12-token requests until one is refused
        mgr.add_request(("a", flood), [3 + (flood + i) % 400 for i in range(12)], model="a")
        mgr.lookup(("a", flood))
        if mgr.allocate(("a", flood), 12) is None:
            mgr.free(("a", flood))
            break
        flood += 1
    held = mgr.admission.held_large()
    assert held[0] == 12 - fb  # a took everything but b's floor
    # b's longest admitted request (40 tokens) runs to its end now, one token at a time
    mgr.add_request("b", list(range(200, 210)), model="b")
    mgr.lookup("b")
    assert mgr.allocate("b", 10) is not None
    for _ in range(30):
        mgr.append_tokens("b", [9])
        assert mgr.allocate("b", 1) is not None
    mgr.check_integrity()


def test_without_the_floor_a_flood_starves_the_other_model():
    """The floor test's mutant: with the smallest floors, b's 10-token request cannot start."""
    mgr = pool(num_large=12, floors=SMALL_FLOORS)
    flood = 0
    while True:
        mgr.add_request(("a", flood), [3 + (flood + i) % 400 for i in range(12)], model="a")
        mgr.lookup(("a", flood))
        if mgr.allocate(("a", flood), 12) is None:
            mgr.free(("a", flood))
            break
        flood += 1
    mgr.add_request("b", list(range(200, 210)), model="b")
    mgr.lookup("b")
    assert mgr.allocate("b", 10) is None


def test_attention_model_beside_a_state_hybrid():
    mgr = pool((A, H), num_large=16)
    prompt = list(range(10, 42))
    serve(mgr, 1, "h", prompt, n_out=3)
    assert serve(mgr, 2, "a", prompt) == 0
    assert serve(mgr, 3, "h", prompt) > 0
    assert mgr.used_bytes == 0


def test_no_page_leaked_after_cancellations():
    mgr = pool(num_large=14)
    rng = random.Random(3)
    live: dict = {}
    for step in range(300):
        if live and rng.random() < 0.3:  # cancel: free at any point (before or after allocating)
            rid = rng.choice(list(live))
            mgr.free(rid)
            del live[rid]
        elif rng.random() < 0.4 or not live:
            rid, name = step, rng.choice("ab")
            mgr.add_request(rid, [rng.randrange(3, 40) for _ in range(rng.randrange(2, 20))], model=name)
            mgr.lookup(rid)
            live[rid] = False
        else:
            rid = rng.choice(list(live))
            req = mgr.requests[rid]
            n = len(req.tokens) - req.num_computed if not live[rid] else 1
            if mgr.allocate(rid, n) is not None:
                mgr.append_tokens(rid, [rng.randrange(3, 40)])
                live[rid] = True
        if step % 10 == 0:
            mgr.check_integrity()
    for rid in list(live):
        mgr.free(rid)
    mgr.check_integrity()
    assert mgr.used_bytes == 0 and sum(mgr.scopes.allocated) == 0 and not mgr.scopes.of
    assert sum(mgr.alloc.used_small) == 0


def test_bad_input_is_refused_at_start():
    with pytest.raises(InvalidArgumentError, match="named twice"):
        MultiModelManager((A, A), "1MiB", tokens_per_page=4)
    with pytest.raises(InsufficientMemoryError, match="floors"):
        pool(num_large=4, max_model_lens={"a": 64, "b": 64})
    with pytest.raises(InvalidArgumentError, match="not a served model"):
        pool(floors={"c": 1})
    odd = named(model(group("state", mamba(16, state_elems=4999), 1), max_len=64), "odd")  # 9998-byte pages
    with pytest.raises(PageSizeError, match=r"LCM page of .* the bound is 8 x the largest small page"):
        MultiModelManager((A, odd), "1GiB", tokens_per_page=4)
    mgr = pool()
    with pytest.raises(InvalidArgumentError, match="unknown model 'c'; this pool serves a, b"):
        mgr.add_request(1, [1, 2, 3], model="c")
    assert not mgr.requests


def test_admission_looks_ahead_at_the_prompts_in_flight():
    """A half-prefilled prompt of one model keeps the pages its next chunks need: the other model's
    admission waits (its first chunk alone would fit) instead of forcing a recompute later."""
    mgr = pool(num_large=8, floors=SMALL_FLOORS)
    mgr.add_request("a", list(range(100, 164)), model="a")  # 64 tokens: 16 pages, 6 large pages
    mgr.lookup("a")
    assert mgr.allocate("a", 4) is not None  # its first chunk
    mgr.append_tokens("a", [])
    serve(mgr, "b0", "b", [7, 8, 9, 10], free=False)  # b runs a short request
    mgr.add_request("b", list(range(200, 264)), model="b")
    mgr.lookup("b")
    assert mgr.allocate("b", 4) is None  # b's whole prompt and a's rest do not fit together
    for _ in range(15):  # a's prefill runs to its end, without any preemption
        assert mgr.allocate("a", 4) is not None
        mgr.append_tokens("a", [])
    mgr.free("a")
    assert mgr.allocate("b", 4) is not None  # alone now: admitted
    mgr.check_integrity()


def test_a_waiting_hit_never_breaks_another_models_floor():
    """A lookup holds its hit until the request's first allocate; hits on one model's cached pages
    (fully evictable large pages) must not lift that model past what the other models' floors leave
    (found by the operation fuzz: held [12, 0] large pages with floors [2, 6] in 12)."""
    mgr = pool(num_large=12, floors={"a": 2 * LCM, "b": 6 * LCM})
    for i in range(4):  # model a's prompts, served and freed: their pages stay cached
        serve(mgr, f"c{i}", "a", [100 * i + t for t in range(40)], n_out=1)
    hits = []
    for i in range(4):  # their repeats wait with their hits held
        mgr.add_request(f"w{i}", [100 * i + t for t in range(40)] + [7], model="a")
        hits.append(mgr.lookup(f"w{i}"))
        mgr.check_integrity()
    assert sum(hits) > 0
    held = mgr.admission.held_large()
    assert held[0] + mgr.floor_pages[1] <= mgr.pool.num_large_pages, held
    serve(mgr, "b0", "b", list(range(500, 524)), n_out=1)  # model b still runs


def test_another_models_protected_pages_never_hold_an_admission_back():
    """Pages model a reused (served twice: the reuse evictor protects them) stay cached once a's
    requests end.  While b runs a request, b's next admissions may still evict them: cached pages
    are anyone's, as the floors count them.  Only b's own protected pages hold b back; before,
    a's four large pages kept b at two requests with half the pool free."""
    mgr = pool(num_large=12, floors=SMALL_FLOORS)
    prompt = list(range(100, 140))
    serve(mgr, "a0", "a", prompt, n_out=1)
    assert serve(mgr, "a1", "a", prompt, n_out=1) == 36
    a_groups, b_groups = mgr.scopes.groups
    assert mgr.evictor.protected_supply()[1] == 4  # a's pages: four fully evictable large pages
    assert mgr.evictor.protected_supply(a_groups)[1] == 4
    assert mgr.evictor.protected_supply(b_groups) == ([0, 0, 0], 0)
    serve(mgr, "b0", "b", list(range(500, 512)), free=False)
    admitted = 0
    for i in range(8):
        mgr.add_request(("b", i), [600 + 50 * i + t for t in range(12)], model="b")
        mgr.lookup(("b", i))
        if mgr.allocate(("b", i), 12) is None:
            mgr.free(("b", i))
            break
        admitted += 1
        mgr.check_integrity()
    assert admitted == 4
    assert mgr.admission.held_large() == [0, 11]
    assert mgr.evictor.protected_supply(a_groups)[1] == 1  # b took three of a's four
    mgr.check_integrity()


def test_split_layer_groups_cuts_each_group_into_power_of_two_layer_counts_in_layer_order():
    from jenga.core.pagesize import split_layer_groups

    spec = ModelSpec("m", (LayerGroup("sliding", SlidingWindowSpec("m", num_kv_heads=1, head_dim=8, window=64),
                                      tuple(range(0, 104, 2)), 16, 52 * 64),
                           LayerGroup("full", FullAttentionSpec("m", num_kv_heads=1, head_dim=8), (1, 3, 5, 7), 16)),
                     128, 104)
    split = split_layer_groups(spec)
    assert [(g.name, g.num_layers) for g in split.groups] == [("sliding.0", 32), ("sliding.1", 16),
                                                              ("sliding.2", 4), ("full", 4)]
    assert sum((g.layers for g in split.groups[:3]), ()) == spec.groups[0].layers  # a partition, in order
    assert all(g.layer_page_bytes == spec.groups[0].layer_page_bytes for g in split.groups[:3])  # same pad per layer
    assert split.groups[3] is spec.groups[1]


def test_a_pair_whose_lcm_page_needs_split_groups_is_planned_with_them():
    """Qwen3-Next-80B's 36 state layers beside Gemma-3-27B's 52 sliding and 10 full layers (bf16 KV): the
    layer counts bring factors 9, 13 and 5 into the LCM (19.14 GiB, 520x the largest page) that no
    pad removes; split into power-of-two layer counts, it is 268 MiB (8x) at the default 1 % pad, and
    68 MiB (2x) with a 1.5 % pad of the state pages: the smallest is taken."""
    specs = [ModelSpec.from_hf_config(n, dtype="bf16", tokens_per_page=16, vision=False, name=n)
             for n in ("qwen3-next-80b", "gemma-3-27b")]
    with pytest.raises(PageSizeError, match=r"LCM page of 19.14 GiB.* ratio is 520x"):
        MultiModelManager(specs, "20GiB", split_groups=False)
    mgr = MultiModelManager(specs, "20GiB")
    assert mgr.pool.large_page_bytes == 68 << 20 == 2 * mgr.model.max_small_page_bytes
    assert mgr.page_plan.pad_frac < 0.02
    assert {g.name for g in mgr.model.groups} >= {"qwen3-next-80b/mamba.0", "gemma-3-27b/sliding.2"}
    assert sorted(layer for g in mgr.model.groups if g.spec.model == "gemma-3-27b" for layer in g.layers) == \
        sorted(layer for g in specs[1].groups for layer in g.layers)
    mgr.add_request(0, list(range(3, 500)), model="gemma-3-27b")
    mgr.allocate(0, 497)
    mgr.check_integrity()
    mgr.free(0)
    assert mgr.used_bytes == 0
