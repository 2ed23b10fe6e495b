"""``LargePageAllocator.check_integrity``: recount its pages and slots from ``state``."""

from __future__ import annotations

from jenga.core.alloc.page_states import CACHED, FREE, USED


def check_allocator(alloc, free_large, visible: list[dict], hidden: dict) -> dict[str, int]:
    """Recount every page of a ``LargePageAllocator`` from ``state``; assert all counters agree.
    ``free_large``, ``visible`` and ``hidden`` are its own free pool and free-slot maps, handed over
    by its ``check_integrity``.  Returns byte totals (free, used, cached)."""
    totals = {"free": 0, "used": 0, "cached": 0}
    seen_free_large = set(free_large)
    assert len(seen_free_large) == len(free_large), "a large page is twice in the pool"
    for large in range(alloc.num_large):
        g = alloc.group_of[large]
        if g == -1:
            assert large in seen_free_large, f"unowned large page {large} not in the pool"
            assert alloc.n_used[large] == alloc.n_cached[large] == 0, f"free large {large} has pages"
            continue
        assert large not in seen_free_large, f"owned large page {large} in the pool"
        k = alloc.small_per_large[g]
        st = alloc.state[g][large * k:(large + 1) * k]
        used, cached = st.count(USED), st.count(CACHED)
        assert (used, cached) == (alloc.n_used[large], alloc.n_cached[large]), \
            f"large {large}: counted {used}/{cached}, recorded {alloc.n_used[large]}/{alloc.n_cached[large]}"
        assert used + cached > 0, f"large {large} all free but still owned by group {g}"
        assert bool(alloc.in_e[large]) == (used == 0), f"large {large}: E flag {alloc.in_e[large]}, used {used}"
        assert not (alloc.in_e[large] and large in visible[g]), f"large {large} in E with visible free slots"
        slots = hidden.get(large) if alloc.in_e[large] else visible[g].get(large)
        free_slots = sorted(slots or [])
        expect = [i for i in range(k) if st[i] == FREE]
        assert free_slots == expect, f"large {large}: free slots {free_slots} != {expect}"
        totals["used"] += used * alloc.page_bytes[g]
        totals["cached"] += cached * alloc.page_bytes[g]
        totals["free"] += (k - used - cached) * alloc.page_bytes[g]
    totals["free"] += len(free_large) * alloc.large_page_bytes
    assert sum(totals.values()) == alloc.num_large * alloc.large_page_bytes, f"bytes do not add up: {totals}"
    for g in range(len(alloc.small_per_large)):
        n_used = alloc.state[g].count(USED)
        assert n_used == alloc.used_small[g], f"group {g}: {n_used} used pages, counter {alloc.used_small[g]}"
        vis = sum(len(v) for v in visible[g].values())
        assert vis == alloc.free_small[g], f"group {g}: visible free {vis} != {alloc.free_small[g]}"
    return totals
