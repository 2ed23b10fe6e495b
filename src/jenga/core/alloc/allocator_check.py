"""``LargePageAllocator.check_integrity``: recount its pages and slots from ``state``."""

from __future__ import annotations

from jenga.core.alloc.page_states import CACHED, FREE, USED


def check_allocator(alloc, free_large, visible: list[dict], hidden: dict) -> dict[str, int]:
    """Recount every page of a ``LargePageAllocator`` from ``state``; assert all counters agree.
    ``free_large``, ``visible`` and ``hidden`` are its own free pool and free-slot maps, handed over
    by its ``check_integrity``.  Returns byte totals (free, used, cached)."""
    seen_free_large = set(free_large)
    assert len(seen_free_large) == len(free_large), "a large page is twice in the pool"
    group_of, n_used, n_cached, in_e = alloc.group_of, alloc.n_used, alloc.n_cached, alloc.in_e
    states, per_large, page_bytes = alloc.state, alloc.small_per_large, alloc.page_bytes
    used_bytes = cached_bytes = free_bytes = 0
    for large in range(alloc.num_large):
        g = group_of[large]
        if g == -1:
            assert large in seen_free_large, f"unowned large page {large} not in the pool"
            assert n_used[large] == n_cached[large] == 0, f"free large {large} has pages"
            continue
        assert large not in seen_free_large, f"owned large page {large} in the pool"
        k = per_large[g]
        st = states[g][large * k:(large + 1) * k]
        used, cached = st.count(USED), st.count(CACHED)
        assert used == n_used[large] and cached == n_cached[large], \
            f"large {large}: counted {used}/{cached}, recorded {n_used[large]}/{n_cached[large]}"
        assert used + cached > 0, f"large {large} all free but still owned by group {g}"
        e = in_e[large]
        assert bool(e) == (used == 0), f"large {large}: E flag {e}, used {used}"
        assert not (e and large in visible[g]), f"large {large} in E with visible free slots"
        slots = hidden.get(large) if e else visible[g].get(large)
        free_slots = sorted(slots or [])
        expect = [i for i in range(k) if st[i] == FREE] if k > 1 else ([0] if st[0] == FREE else [])
        assert free_slots == expect, f"large {large}: free slots {free_slots} != {expect}"
        used_bytes += used * page_bytes[g]
        cached_bytes += cached * page_bytes[g]
        free_bytes += (k - used - cached) * page_bytes[g]
    totals = {"free": free_bytes, "used": used_bytes, "cached": cached_bytes}
    totals["free"] += len(free_large) * alloc.large_page_bytes
    assert sum(totals.values()) == alloc.num_large * alloc.large_page_bytes, f"bytes do not add up: {totals}"
    for g in range(len(alloc.small_per_large)):
        n_used = alloc.state[g].count(USED)
        assert n_used == alloc.used_small[g], f"group {g}: {n_used} used pages, counter {alloc.used_small[g]}"
        vis = sum(len(v) for v in visible[g].values())
        assert vis == alloc.free_small[g], f"group {g}: visible free {vis} != {alloc.free_small[g]}"
    return totals
