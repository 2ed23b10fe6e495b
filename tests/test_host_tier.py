"""The host tier (``host_memory_bytes``): demotion by kind, promotion at lookup, copy plans.

A hypothesis state machine (``test_properties``'s, with a host tier) follows every copy plan on
its shadow of page contents and checks ``check_integrity()`` (both tiers) after every step; a
seeded random trace copies real numpy page contents by the plans and checks every token a step
reads; exact page ids in a hand-checked example; salts; typed errors on bad sizes.
"""

from __future__ import annotations

import copy
import functools
import random
from collections import Counter

import numpy as np
import pytest
from conftest import full, group, model, serve, sliding
from hypothesis import strategies as st
from hypothesis.stateful import initialize, run_state_machine_as_test
from test_properties import MAX_LEN, SETTINGS, SPECS, TPP, ManagerMachine, min_large

from jenga.core.manager.manager import KVCacheManager
from jenga.core.pagesize import with_base_page
from jenga.core.policy.base import OUT_OF_WINDOW_AGE
from jenga.core.tables import TokenTable
from jenga.errors import InsufficientMemoryError, InvalidArgumentError, JengaError


def host_manager(spec, num_large: int, num_host_large: int, *, tpp: int = TPP, **kw) -> KVCacheManager:
    lp = with_base_page(spec, tpp).large_page_bytes
    kw.setdefault("eviction", "lru")
    mgr = KVCacheManager(spec, (num_large + 1) * lp, tokens_per_page=tpp, fit_pages=False, window_slack=0,
                         host_memory_bytes=num_host_large * lp, **kw)
    assert mgr.pool.num_large_pages == num_large and mgr.host_num_large == num_host_large
    return mgr


# ------------------------------------------------------------------ the state machine, with a host tier
class HostMachine(ManagerMachine):
    """Every lookup and allocate is followed by the engine's copies: the plan's demotes, then its
    promotes, applied to the shadow of what each device and host page holds."""

    @initialize(extra=st.integers(0, 4), caching=st.sampled_from([True, True, True, False]),
                host=st.integers(1, 6), host_policy=st.sampled_from(["per-kind", "all-groups"]),
                aged=st.booleans())
    def setup(self, extra, caching, host, host_policy, aged):
        self.spec = SPECS[self.spec_name]
        num_large = min_large(self.spec_name) + extra
        self.num_large, self.caching = num_large, caching
        lp = with_base_page(self.spec, TPP).large_page_bytes
        self.mgr = KVCacheManager(self.spec, (num_large + 1) * lp, tokens_per_page=TPP, enable_prefix_caching=caching,
                                  fit_pages=False, window_slack=0, eviction=self.eviction,
                                  out_of_window_age=OUT_OF_WINDOW_AGE if aged else 0,
                                  host_memory_bytes=host * lp, host_policy=host_policy)
        self.live, self.shadow, self.host_shadow = {}, {}, {}
        self.next_id = 0
        self.has_images = any(p.per_image for p in self.mgr.policies)
        self.has_state = any(type(p).__name__ == "MambaPolicy" for p in self.mgr.policies)
        self.refill_at = 8
        mgr, lookup, allocate = self.mgr, self.mgr.lookup, self.mgr.allocate

        def lookup_then_copy(*a, **kw):
            out = lookup(*a, **kw)
            self._copy(mgr.take_copy_plan())
            return out

        def allocate_then_copy(*a, **kw):
            out = allocate(*a, **kw)
            self._copy(mgr.take_copy_plan())
            return out
        mgr.lookup, mgr.allocate = lookup_then_copy, allocate_then_copy

    def _copy(self, plan):
        for g, rows in plan.demote.items():
            for d, h in rows.tolist():
                self.host_shadow[(g, h)] = copy.deepcopy(self.shadow.get((g, d)))
                self.seen["demoted"] += 1
        for g, rows in plan.promote.items():
            for h, d in rows.tolist():
                self.shadow[(g, d)] = copy.deepcopy(self.host_shadow[(g, h)])
                self.seen["promoted"] += 1

    def _free_all_and_refill(self):
        super()._free_all_and_refill()
        self._copy(self.mgr.take_copy_plan())
        assert not any(self.mgr.host.alloc.used_small), "host pages stay pinned after every request ended"
        st_ = self.mgr.stats()
        assert st_.host_used_bytes <= st_.host_total_bytes


@pytest.mark.parametrize("spec_name", ["full+mamba", "every-kind"])
def test_random_request_streams_with_a_host_tier(spec_name):
    seen: Counter = Counter()
    machine = type(f"HostMachine_{spec_name}", (HostMachine,), {"spec_name": spec_name, "seen": seen})
    run_state_machine_as_test(machine, settings=SETTINGS)
    print(spec_name, dict(seen))
    assert seen["demoted"] > 0 and seen["promoted"] > 0 and seen["reuse:t"] > 0, dict(seen)


def test_random_request_streams_with_a_host_tier_and_reuse_eviction():
    """The same with jenga's default order (``eviction="reuse"``): promotions under admission's
    rule, which keeps protected pages while others run, and the class-3 counters checked."""
    seen: Counter = Counter()
    machine = type("HostMachineReuse", (HostMachine,), {"spec_name": "full+mamba", "seen": seen, "eviction": "reuse"})
    run_state_machine_as_test(machine, settings=SETTINGS)
    assert seen["demoted"] > 0 and seen["promoted"] > 0 and seen["evicted"] > 0, dict(seen)


# ------------------------------------------------------------------ a random trace against numpy page contents
def _trace(host_policy: str, seed: int) -> Counter:
    """Requests on shared prefixes through a small device pool and a host tier; page contents are
    token ids in numpy arrays per tier, copied by each plan; every token a step reads is checked."""
    spec = model(group("full", full(), 1), group("swa", sliding(5), 2, 1), max_len=64)
    mgr = host_manager(spec, 20, 40, host_policy=host_policy, out_of_window_age=OUT_OF_WINDOW_AGE)
    pool = mgr.pool
    dev = [np.full((pool.num_large_pages * k, TPP), -1) for k in pool.small_per_large]
    host = [np.full((mgr.host_num_large * k, TPP), -1) for k in pool.small_per_large]
    rng = random.Random(seed)
    bases = [[rng.randrange(1, 999) for _ in range(40)] for _ in range(5)]
    seen: Counter = Counter()

    def run_plan():
        plan = mgr.take_copy_plan()
        for g, rows in plan.demote.items():
            host[g][rows[:, 1]] = dev[g][rows[:, 0]]
        for g, rows in plan.promote.items():
            dev[g][rows[:, 1]] = host[g][rows[:, 0]]
        seen["pages copied"] += plan.num_pages
        return plan

    for rid in range(60):
        prompt = rng.choice(bases)[:rng.randrange(8, 24)] + [rng.randrange(1000, 2000)]
        mgr.add_request(rid, prompt, cache_salt=rng.choice([None, None, "other"]))
        hit = mgr.lookup(rid)
        run_plan()
        t = mgr.allocate(rid, len(prompt) - hit)
        run_plan()
        if t is None:
            mgr.free(rid)
            seen["did not fit"] += 1
            continue
        seen["hit tokens"] += hit
        for gt in t.groups:  # what this step reads, then what it writes
            assert isinstance(gt, TokenTable)
            g, pol = gt.group, mgr.policies[gt.group]
            for pos in range(pol.footprint.first_needed(hit), hit):
                got = dev[g][gt.page_ids[pos // TPP], pos % TPP]
                assert got == prompt[pos], f"request {rid} group {g} token {pos}: page holds {got}, not {prompt[pos]}"
            for pos in range(max(hit, gt.write_from), len(prompt)):
                dev[g][gt.page_ids[pos // TPP], pos % TPP] = prompt[pos]
        mgr.append_tokens(rid, [7])
        mgr.free(rid)
        mgr.check_integrity()
    run_plan()
    st_ = mgr.stats()
    assert st_.used_bytes == 0 and not any(mgr.host.alloc.used_small)
    seen["bytes demoted"], seen["bytes promoted"], seen["host hit tokens"] = (st_.bytes_demoted, st_.bytes_promoted,
                                                                               st_.host_hit_tokens)
    return seen


@pytest.mark.parametrize("host_policy", ["per-kind", "all-groups"])
def test_random_trace_copies_hold_every_token_read(host_policy):
    seen = _trace(host_policy, 3)
    assert seen["host hit tokens"] > 0 and seen["bytes promoted"] > 0 and seen["did not fit"] == 0, seen


def test_per_kind_demotes_fewer_bytes_than_all_groups():
    """Sliding pages that left the window during prefill are not demoted per kind (only a hit
    ending inside them reads them: on this trace of random prompt ends all-groups serves some
    more hits with them, at about twice the bytes; ``benchmarks/host_tier.py`` measures both)."""
    per_kind, alike = _trace("per-kind", 5), _trace("all-groups", 5)
    assert per_kind["bytes demoted"] < 0.7 * alike["bytes demoted"], (per_kind, alike)
    assert per_kind["host hit tokens"] > 0 and alike["host hit tokens"] > 0, (per_kind, alike)


# ------------------------------------------------------------------ exact pages
def test_exact_demote_and_promote_pages():
    """One full-attention group, one page per large page, 2 tokens a page; 3 device and 4 host pages."""
    mgr = host_manager(model(group("full", full(), 1), max_len=64), 3, 4)
    mgr.add_request("a", [1, 2, 3, 4, 5])
    assert mgr.lookup("a") == 0
    assert mgr.allocate("a", 5).groups[0].page_ids == [0, 1, 2]
    mgr.append_tokens("a", [9])
    mgr.free("a")  # pages 0 and 1 cached ([1, 2], [1, 2, 3, 4]), page 2 free
    assert mgr.take_copy_plan().empty
    mgr.add_request("b", [11, 12, 13, 14, 15])
    mgr.lookup("b")
    # b takes free page 2, then evicts the deeper page 1 (-> host 0), then page 0 (-> host 1)
    assert mgr.allocate("b", 5).groups[0].page_ids == [2, 1, 0]
    plan = mgr.take_copy_plan()
    assert plan.demote[0].tolist() == [[0, 1], [1, 0]] and not plan.promote
    assert plan.bytes == 2 * mgr.pool.page_bytes[0]
    mgr.append_tokens("b", [9])
    mgr.free("b")  # device: 2 and 1 cached (b's prefix), 0 free
    mgr.add_request("c", [1, 2, 3, 4, 6])
    assert mgr.lookup("c") == 4  # a's prefix, from the host
    plan = mgr.take_copy_plan()
    # host 1 ([1, 2]) -> free device page 0; host 0 ([1, 2, 3, 4]) -> device page 1, b's deeper page
    # evicted first (-> host 2); the host keeps its copies
    assert plan.promote[0].tolist() == [[0, 1], [1, 0]]
    assert plan.demote[0].tolist() == [[1, 2]]
    # c's last token takes device page 2, b's cached first page ([11, 12] -> host 3)
    assert mgr.allocate("c", 1).groups[0].page_ids == [0, 1, 2]
    assert mgr.take_copy_plan().demote[0].tolist() == [[2, 3]]
    s = mgr.stats()
    assert (s.promotions, s.demotions, s.host_hit_tokens) == (2, 4, 4)
    assert s.host_used_bytes == s.host_total_bytes == 4 * mgr.pool.page_bytes[0]
    assert s.bytes_demoted == 4 * mgr.pool.page_bytes[0] and s.bytes_promoted == 2 * mgr.pool.page_bytes[0]
    mgr.check_integrity()


def test_kv_events_name_the_tier_of_each_page():
    """3 device and 2 host pages of one full-attention group, three 2-page prefixes in turn, then the
    first again: each demotion is a host ``BlockStored`` ("CPU", the key only) before the device's
    ``BlockRemoved``, the host's own evictions are "CPU" removals (oldest prefix, deepest first), the
    device's stores carry their tokens and kind; a reset is one ``AllBlocksCleared`` for both tiers."""
    from jenga.core.prefix.events import AllBlocksCleared, BlockStored

    mgr = host_manager(model(group("full", full(), 1), max_len=64), 3, 2)
    mgr.enable_kv_events()
    prompts = {"a": [1, 2, 3, 4, 5], "b": [11, 12, 13, 14, 15], "c": [21, 22, 23, 24, 25]}
    for rid in ("a", "b", "c"):
        serve(mgr, rid, prompts[rid], [9])
        mgr.take_copy_plan()
    name = {h: f"{rid}{i}" for rid in prompts for i, h in enumerate(mgr.hasher.memo._memo[rid][1][:2])}
    got = []
    for e in mgr.take_events():
        assert e.group == 0 and len(e.block_hashes) == 1
        tag = ("+" if isinstance(e, BlockStored) else "-") + e.medium + " " + name[e.block_hashes[0]]
        if isinstance(e, BlockStored):
            assert e.kind == "full" and e.block_size == 2
            assert e.token_ids == ([] if e.medium == "CPU" else prompts[tag[-2]][2 * int(tag[-1]):][:2]), e
        got.append(tag)
    assert got == ["+GPU a0", "+GPU a1",
                   "+CPU a1", "+CPU a0", "-GPU a1", "-GPU a0", "+GPU b0", "+GPU b1",
                   "-CPU a1", "+CPU b1", "-CPU a0", "+CPU b0", "-GPU b1", "-GPU b0", "+GPU c0", "+GPU c1"]
    assert mgr.reset_prefix_cache()
    assert mgr.take_events() == [AllBlocksCleared()]
    assert not len(mgr.host.index)


def test_promotion_follows_admission_and_spares_reused_pages():
    """A lookup's promotion takes device pages under admission's rule: while another request runs
    it may not evict the evictor's protected (reused) pages, so it is refused before any page
    moves; alone, the request promotes its whole host hit.  One full group, one token a page,
    8 device and 8 host pages, ``eviction="reuse"``."""
    mgr = host_manager(model(group("full", full(), 1), max_len=64), 8, 8, tpp=1, eviction="reuse")
    serve(mgr, "x", [1, 2, 3], [0])  # pages 0, 1, 2
    serve(mgr, "x2", [1, 2, 4], [0])  # hits 0, 1 (reused: protected); page 3
    serve(mgr, "p", [50, 51, 52], [0])  # pages 4, 5, 6
    mgr.add_request("r", [20, 21, 22, 23, 24, 25])
    assert mgr.lookup("r") == 0
    # r alone takes free page 7, then the one-off pages oldest first: p's pages go to the host
    assert mgr.allocate("r", 6).groups[0].page_ids == [7, 2, 3, 6, 5, 4]
    mgr.append_tokens("r", [])
    assert mgr.take_copy_plan().demote[0].tolist() == [[2, 0], [3, 1], [4, 4], [5, 3], [6, 2]]
    assert sorted(mgr.evictor.protected[0]) == [0, 1]
    mgr.add_request("z", [50, 51, 52, 53])
    # p's prefix lies on the host, but the device could only hold it by evicting the reused pages
    # 0, 1 while r runs (an admission would be refused the same way): no promotion, no demotion
    assert mgr.lookup("z") == 0
    assert mgr.take_copy_plan().empty
    assert sorted(mgr.evictor.protected[0]) == [0, 1]
    # z waits for its host hit (recomputing it would evict what the rule protects, or take pages
    # the promotion needs): no allocate until a new lookup
    assert not mgr.can_allocate("z", 1) and mgr.allocate("z", 1) is None
    mgr.check_integrity()
    mgr.free("z")
    mgr.free("r")
    mgr.add_request("z2", [50, 51, 52, 53])
    assert mgr.lookup("z2") == 3  # alone now: host 2, 3, 4 -> r's cached pages 6, 5, 4 (demoted)
    plan = mgr.take_copy_plan()
    assert plan.promote[0].tolist() == [[2, 6], [3, 5], [4, 4]]
    assert plan.demote[0].tolist() == [[4, 5], [5, 6], [6, 7]]
    assert mgr.allocate("z2", 1).groups[0].page_ids == [4, 5, 6, 3]
    assert sorted(mgr.evictor.protected[0]) == [0, 1]
    mgr.check_integrity()


def test_request_freed_after_promoting_the_same_pages_twice():
    """A request whose promoted pages left its hit (shrunk to 0), were evicted before the plan was
    taken (their pairs left it) and promoted again by its next lookup into the same device pages,
    then freed before its first allocate: each pending pair is evicted back once.  One full
    group, one token a page, 4 device and 8 host pages."""
    mgr = host_manager(model(group("full", full(), 1), max_len=64), 4, 8, tpp=1)
    serve(mgr, "a", [1, 2, 3, 4], [0])
    serve(mgr, "b", [11, 12, 13, 14], [0])  # a's pages 0..3 -> host 3..0
    assert mgr.take_copy_plan().demote[0].tolist() == [[0, 3], [1, 2], [2, 1], [3, 0]]
    mgr.add_request("c", [1, 2, 3, 4, 5])
    assert mgr.lookup("c") == 4 and mgr.shrink_hit("c", 0) == 0  # host 3..0 -> device 0..3, not held
    mgr.add_request("d", [21, 22, 23, 24])
    assert mgr.lookup("d") == 0 and mgr.allocate("d", 4).groups[0].page_ids == [3, 2, 1, 0]
    mgr.free("d")  # c's promotions were evicted before their copies ran: no pair left
    assert mgr.lookup("c") == 4  # promoted again, into the same device pages
    mgr.check_integrity()
    mgr.free("c")  # never ran: its four pending promotions are evicted back, once each
    mgr.check_integrity()
    assert mgr.take_copy_plan().promote == {} and mgr.stats().used_bytes == 0


def test_request_freed_after_its_pages_were_promoted_for_another():
    """As above, but the next promotion into the same device pages is another request's (``e``,
    its hit shrunk to 0 so nothing holds them): freeing ``c`` before its first allocate leaves
    ``e``'s pending promotions alone."""
    mgr = host_manager(model(group("full", full(), 1), max_len=64), 4, 8, tpp=1)
    serve(mgr, "a", [1, 2, 3, 4], [0])
    serve(mgr, "b", [11, 12, 13, 14], [0])
    mgr.take_copy_plan()
    mgr.add_request("c", [1, 2, 3, 4, 5])
    assert mgr.lookup("c") == 4 and mgr.shrink_hit("c", 0) == 0
    mgr.add_request("d", [21, 22, 23, 24])
    assert mgr.lookup("d") == 0 and mgr.allocate("d", 4).groups[0].page_ids == [3, 2, 1, 0]
    mgr.free("d")
    mgr.add_request("e", [1, 2, 3, 4, 6])
    assert mgr.lookup("e") == 4 and mgr.shrink_hit("e", 0) == 0
    mgr.free("c")
    mgr.check_integrity()
    assert mgr.take_copy_plan().promote[0].tolist() == [[0, 3], [1, 2], [2, 1], [3, 0]]


def test_a_promotion_that_stops_short_keeps_the_device_hit():
    """The longest hit over both tiers (6 tokens: full pages 3..5 and the window's sliding page 5
    on the host) does not hold the sliding page the device's own 3-token hit reads (page 2, out of
    the longer hit's window).  The promotion runs out of device pages before the sliding group's
    page; it must not have evicted that page for the full group's pages meanwhile: the lookup finds
    at least what ``cached_tokens`` (device only) answered.  Full attention and a 2-token window,
    one token a page, 12 device and 8 host pages."""
    mgr = host_manager(model(group("full", full(), 1), group("swa", sliding(2), 1, 1), max_len=64), 12, 8, tpp=1)
    serve(mgr, "a", [1, 2, 3, 4, 5, 6], [0])
    mgr.add_request("b", [11, 12, 13])
    assert mgr.lookup("b") == 0 and [t.page_ids for t in mgr.allocate("b", 3).groups] == [[10, 9, 8], [7, 6, 5]]
    assert serve(mgr, "p", [1, 2, 3], [0]) == 0  # a's deeper pages go to the host
    mgr.take_copy_plan()
    mgr.add_request("c", [1, 2, 3, 4, 5, 6, 7])
    assert mgr.cached_tokens("c") == 3  # p's pages
    assert mgr.lookup("c") == 3
    # two of the full group's three host pages came to device pages 0 and 1 before the device ran
    # out; the sliding page of p's hit (device page 2) stayed
    assert mgr.take_copy_plan().promote[0].tolist() == [[1, 0], [2, 1]]
    mgr.check_integrity()
    # c's next token reads its 3-token hit (the promoted full pages are taken back: c recomputes them)
    assert [t.page_ids for t in mgr.allocate("c", 1).groups] == [[11, 4, 3, 0], [None, None, 2, 1]]
    mgr.check_integrity()


def test_salts_never_cross_tiers():
    mgr = host_manager(model(group("full", full(), 1), max_len=64), 3, 8)
    prompt = [1, 2, 3, 4, 5]
    for rid, salt in (("a", "tenant-a"), ("flush", None)):
        tokens = prompt if rid == "a" else [40, 41, 42, 43, 44, 45]
        mgr.add_request(rid, tokens, cache_salt=salt)
        mgr.lookup(rid)
        mgr.allocate(rid, len(tokens))
        mgr.append_tokens(rid, [9])
        mgr.free(rid)
    assert mgr.take_copy_plan().demote  # a's pages went to the host
    mgr.add_request("b", prompt, cache_salt="tenant-b")
    mgr.add_request("c", prompt)
    assert mgr.lookup("b") == 0 and mgr.lookup("c") == 0 and mgr.take_copy_plan().empty
    mgr.add_request("a2", prompt, cache_salt="tenant-a")
    assert mgr.lookup("a2") == 4 and mgr.take_copy_plan().promote
    mgr.check_integrity()


@functools.cache
def _small_model():
    return model(group("full", full(), 1), group("swa", sliding(3), 1, 1), max_len=MAX_LEN)


@pytest.mark.parametrize("host_bytes, error", [(1, InsufficientMemoryError), ("lots", JengaError),
                                               (-5, JengaError), (2.5, JengaError)])
def test_bad_host_size_is_a_typed_error(host_bytes, error):
    with pytest.raises(error, match="host|bytes|size|memory"):
        KVCacheManager(_small_model(), "1MiB", host_memory_bytes=host_bytes)


def test_bad_host_policy_and_no_tier():
    with pytest.raises(InvalidArgumentError, match="host_policy"):
        KVCacheManager(_small_model(), "1MiB", host_memory_bytes="1MiB", host_policy="everything")
    mgr = KVCacheManager(_small_model(), "1MiB")
    assert mgr.take_copy_plan().empty and mgr.host_num_large == 0 and mgr.stats().host_total_bytes == 0
