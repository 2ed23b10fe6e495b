"""Prefix-subset evictor: order by (last access, -prefix length), balanced and aligned (§5)."""

from __future__ import annotations

from conftest import (
    cached_keys,
    cross,
    full,
    group,
    make_manager,
    model,
    page_ids,
    run,
    serve,
    sliding,
    toy_model,
)

from jenga.core.request import ImageRef

FULL, SWA = 0, 1
A, B, C, D, E, F, G, H = range(1, 9)  # the paper's letters as token ids (1 token per page)


def drain_large(mgr) -> list[list[tuple[int, int]]]:
    """Call evict_large until E is empty; the (group, page) pairs each call dropped."""
    order = []
    while True:
        before = [dict(k) for k in mgr.index.key_of]
        if mgr.alloc.evict_large() is None:
            return order
        order.append(sorted((g, p) for g, keys in enumerate(before) for p in keys
                            if p not in mgr.index.key_of[g]))
        mgr.check_integrity()


def paper_example():
    """§5.1: one full and one sliding layer (W = 2); [ABCD] -> E, F then [ABCDG] -> H.

    Both groups have 128 B pages, so every small page is its own large page (k = 1) and
    ``evict_large`` follows the global key order across both layers.
    """
    spec = model(group("full", full(), 1), group("swa", sliding(2), 1, first_layer=1))
    mgr = make_manager(spec, 16)
    assert mgr.alloc.small_per_large == [1, 1]
    mgr.add_request(1, [A, B, C, D])
    assert mgr.lookup(1) == 0
    run(mgr, 1, 4, [E])  # step 1 (time 1): prefill, sample E
    assert page_ids(mgr, 1, FULL) == [0, 1, 2, 3]
    # W = 2 includes the token itself: the next token (position 4) reads positions 3..4,
    # so A, B, C leave the window as soon as the prefill is committed
    assert page_ids(mgr, 1, SWA) == [None, None, None, 7]
    run(mgr, 1, 1, [F])  # step 2 (time 2): decode E, sample F
    assert page_ids(mgr, 1, FULL) == [0, 1, 2, 3, 8]
    assert page_ids(mgr, 1, SWA) == [None, None, None, None, 9]
    mgr.free(1)
    full_pages = dict(zip("ABCDE", [0, 1, 2, 3, 8], strict=True))
    swa_pages = dict(zip("ABCDE", [4, 5, 6, 7, 9], strict=True))
    # balanced: every page request 1 still held gets its last access (2) in both layers;
    # pages that left the window keep the time they left (1 for A, B, C; 2 for D)
    assert cached_keys(mgr, FULL) == {0: (2, -1), 1: (2, -2), 2: (2, -3), 3: (2, -4), 8: (2, -5)}
    assert cached_keys(mgr, SWA) == {4: (1, -1), 5: (1, -2), 6: (1, -3), 7: (2, -4), 9: (2, -5)}

    mgr.add_request(2, [A, B, C, D, G])
    assert mgr.lookup(2) == 4  # full: A..D; sliding: only D (the window of G)
    assert page_ids(mgr, 2, FULL) == [0, 1, 2, 3]
    assert page_ids(mgr, 2, SWA) == [None, None, None, 7]  # A, B, C are not refreshed
    run(mgr, 2, 1, [H])  # time 3
    full_pages["G"], swa_pages["G"] = 10, 11
    assert page_ids(mgr, 2, FULL) == [0, 1, 2, 3, 10]
    assert page_ids(mgr, 2, SWA) == [None, None, None, None, 11]
    mgr.free(2)
    return mgr, full_pages, swa_pages


def test_paper_worked_example_keys():
    mgr, fp, sp = paper_example()
    assert cached_keys(mgr, FULL) == {fp["A"]: (3, -1), fp["B"]: (3, -2), fp["C"]: (3, -3), fp["D"]: (3, -4),
                                      fp["E"]: (2, -5), fp["G"]: (3, -5)}
    assert cached_keys(mgr, SWA) == {sp["A"]: (1, -1), sp["B"]: (1, -2), sp["C"]: (1, -3), sp["D"]: (3, -4),
                                     sp["E"]: (2, -5), sp["G"]: (3, -5)}


def test_paper_worked_example_eviction_order():
    mgr, fp, sp = paper_example()
    name = {(FULL, p): f"full:{c}" for c, p in fp.items()} | {(SWA, p): f"swa:{c}" for c, p in sp.items()}
    order = [[name[x] for x in step] for step in drain_large(mgr)]
    assert order == [
        ["swa:C"], ["swa:B"], ["swa:A"],  # left the window in step 1: oldest, tail first
        ["full:E"], ["swa:E"],  # timestamp 2: E leaves both layers (aligned) ...
        ["full:G"], ["swa:G"],  # ... before C, D, G (timestamp 3); G (length 5) first
        ["full:D"], ["swa:D"],
        ["full:C"], ["full:B"], ["full:A"],
    ]
    flat = [x for step in order for x in step]
    for layer in ("full", "swa"):
        e = flat.index(f"{layer}:E")
        assert all(e < flat.index(f"{layer}:{c}") for c in "DG")
        assert flat.index(f"{layer}:G") < flat.index(f"{layer}:D")
    assert flat.index("full:E") < flat.index("full:C") and flat.index("full:G") < flat.index("full:C")
    assert mgr.stats().cached_bytes == 0 and mgr.stats().evicted_pages == 12


def test_paper_worked_example_eviction_through_allocation():
    """The same order, seen through the API: a new request that needs 7 pages per layer
    (all but the 16 - 12 free ones, minus 1) evicts exactly swa:A..C, E and G and keeps
    A..D in the full layer, so [ABCD] still hits."""
    mgr, fp, sp = paper_example()
    mgr.add_request("new", list(range(100, 107)))
    t = mgr.allocate("new", 7)
    new_swa = list(t.groups[SWA].page_ids)
    # 16 large pages: 12 cached, 4 free; 14 needed -> 10 evicted: swa C, B, A, then E, G,
    # D in both layers, then full C
    assert mgr.stats().evicted_pages == 10
    assert sorted(cached_keys(mgr, FULL)) == [fp["A"], fp["B"]]
    assert cached_keys(mgr, SWA) == {}
    mgr.append_tokens("new", [107])
    # now only the new request's own out-of-window pages are cached in the sliding layer
    assert sorted(cached_keys(mgr, SWA)) == sorted(new_swa[:6])
    mgr.add_request("q", [A, B, C, D, G])
    assert mgr.lookup("q") == 0  # the sliding layer lost D: no hit of any length > 0


def test_balanced_all_groups_share_the_request_access_time():
    spec = model(group("full", full(), 1), group("swa", sliding(3), 1, first_layer=1))
    mgr = make_manager(spec, 32)
    mgr.add_request("x", [1, 2, 3, 4])
    mgr.add_request("y", [5, 6, 7, 8])
    run(mgr, "x", 4, [9])  # time 1
    run(mgr, "y", 4, [9])  # time 2
    run(mgr, "x", 1, [10])  # time 3
    held = {r: [(g, p) for g in (FULL, SWA) for p in page_ids(mgr, r, g) if p is not None] for r in "xy"}
    # k = 1: page id = large page id, shared by both groups' numbering
    assert held == {"x": [(0, 0), (0, 1), (0, 2), (0, 3), (0, 16), (1, 7), (1, 17)],
                    "y": [(0, 8), (0, 9), (0, 10), (0, 11), (1, 14), (1, 15)]}
    mgr.free("y")
    mgr.free("x")
    keys = {(g, p): k for g in (FULL, SWA) for p, k in cached_keys(mgr, g).items()}
    # every page a request held at free gets its last access, whatever the group
    assert {keys[gp][0] for gp in held["x"]} == {3}
    assert {keys[gp][0] for gp in held["y"]} == {2}
    # out-of-window pages keep the (earlier) time they left
    assert {gp: keys[gp] for gp in keys if gp not in held["x"] + held["y"]} == {
        (1, 4): (1, -1), (1, 5): (1, -2), (1, 6): (3, -3), (1, 12): (2, -1), (1, 13): (2, -2)}
    # x's page of token 3 left the window at time 3 and y ended at time 2: y's held pages
    # go before it although y's window page (1, 14) is a "later" token
    assert keys[(1, 14)] < keys[(1, 6)]


def test_aligned_the_same_tail_tokens_leave_every_group_first():
    spec = model(group("a", full(), 1), group("b", full(), 1, first_layer=1))
    mgr = make_manager(spec, 16)
    mgr.add_request("r", [1, 2, 3, 4])
    run(mgr, "r", 4, [5])
    mgr.free("r")
    # one request, one time: pages leave by descending token position, both groups in step
    assert drain_large(mgr) == [[(0, 3)], [(1, 7)], [(0, 2)], [(1, 6)], [(0, 1)], [(1, 5)], [(0, 0)], [(1, 4)]]


def test_large_page_key_is_the_max_of_its_small_pages():
    mgr = make_manager(toy_model(), 3)  # self: k = 2
    mgr.add_request("x", [1, 2])
    run(mgr, "x", 2, [3])  # time 1: pages 0, 1 (large 0)
    mgr.free("x")
    mgr.add_request("y", [1, 9])
    assert mgr.lookup("y") == 1  # re-touches page 0
    run(mgr, "y", 1, [4])  # time 2: page 2 (large 1)
    mgr.add_request("z", [7, 8])
    run(mgr, "z", 2, [5])  # time 3: pages 4, 5 (large 2)
    mgr.free("y")
    mgr.free("z")
    assert cached_keys(mgr, 0) == {0: (2, -1), 1: (1, -2), 2: (2, -2), 4: (3, -1), 5: (3, -2)}
    # large 0 holds the oldest page (1, -2) but its key is max((2, -1), (1, -2)) = (2, -1);
    # large 1's key is (2, -2) < (2, -1), so it goes first
    assert drain_large(mgr) == [[(0, 2)], [(0, 0), (0, 1)], [(0, 4), (0, 5)]]


def test_evict_small_skips_fully_evictable_large_pages():
    mgr = make_manager(toy_model(), 3)
    mgr.add_request("c", [5, 6])
    run(mgr, "c", 2, [7])  # time 1: pages 0, 1 (large 0)
    mgr.free("c")
    mgr.add_request("a", [1, 2])
    run(mgr, "a", 2, [3])  # time 2: pages 2, 3 (large 1)
    mgr.add_request("b", [1, 9])
    assert mgr.lookup("b") == 1
    run(mgr, "b", 1, [4])  # page 4 (large 2)
    mgr.free("a")  # page 3 cached (2, -2); page 2 still used by b
    assert cached_keys(mgr, 0) == {0: (1, -1), 1: (1, -2), 3: (2, -2)}
    assert mgr.alloc.num_e == 1 and mgr.alloc.in_e[0]
    # the per-group LRU takes page 3 although large 0's pages are older: they stay whole
    assert mgr.alloc.evict_small(0) == 3
    assert mgr.alloc.evict_small(0) is None
    assert mgr.alloc.evict_large() == 0
    mgr.check_integrity()


def test_whole_image_eviction():
    spec = model(group("full", full(), 1), group("cross", cross(), 1, first_layer=1))
    mgr = make_manager(spec, 32)
    imgs = [ImageRef(0, 3, "cat"), ImageRef(2, 2, "dog")]
    mgr.add_request("r", [1, 2, 3], images=imgs)
    t = run(mgr, "r", 3, [4])
    assert t.groups[1].pages == {0: [3, 4, 5], 1: [6, 7]}
    mgr.free("r")
    pol = mgr.policies[1]
    lens = {name: pol.image_len(img) for name, img in zip(("cat", "dog"), imgs, strict=True)}
    assert cached_keys(mgr, 1) == {p: (1, -lens["cat"]) for p in (3, 4, 5)} | {
        p: (1, -lens["dog"]) for p in (6, 7)}
    order = [x for step in drain_large(mgr) for x in step]
    cross_order = [p for g, p in order if g == 1]
    first, second = ([3, 4, 5], [6, 7]) if lens["cat"] > lens["dog"] else ([6, 7], [3, 4, 5])
    # all pages of one image leave before any page of the other
    assert sorted(cross_order[:len(first)]) == first and sorted(cross_order[len(first):]) == second


def reaches(root, target, skip=()) -> bool:
    """Whether ``target`` is reachable from ``root`` through object references (``gc``), not
    passing through the objects in ``skip`` nor through a module or its namespace (every function
    refers to its module's globals: through them everything reaches everything)."""
    import gc
    import sys

    modules = [m for m in list(sys.modules.values()) if m is not None]
    seen, stack = {id(o) for o in skip} | {id(m) for m in modules} | {id(vars(m)) for m in modules}, [root]
    while stack:
        obj = stack.pop()
        if obj is target:
            return True
        if id(obj) in seen or isinstance(obj, (type, bytes, bytearray, str, int)):
            continue
        seen.add(id(obj))
        stack.extend(gc.get_referents(obj))
    return False


def full_model():
    return model(group("full", full(), 2))


def test_the_allocator_owns_the_evictor_and_the_evictor_never_reaches_it():
    """Parts wired by their constructors, no cycle: the allocator is handed its evictor, and nothing
    the evictor holds leads back to the allocator or the manager (it reads the pool's ``PageViews``)."""
    for eviction in ("lru", "reuse", "predict"):
        mgr = make_manager(full_model(), 64, eviction=eviction)
        serve(mgr, "a", [A, B, C, D], [E, F])
        serve(mgr, "b", [A, B, C, G], [H])  # a hit; pages cached and keyed, large pages in E
        alloc, evictor = mgr._alloc, mgr._evictor
        assert alloc.evictor is evictor and alloc.e.evictor is evictor
        assert reaches(alloc, evictor)  # (the walk finds what is there)
        assert not reaches(evictor, alloc) and not reaches(evictor, mgr), eviction
