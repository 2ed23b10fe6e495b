"""``KVCacheManager.cached_tokens`` is memoized per request (``PrefixLookup.peek``): the same
tokens, ``max_tokens`` and index tables give the last answer without walking the prompt again; a
new ``max_tokens`` or an index change gives a fresh one, and a request freed and added again starts
without a memo (the memo lives on its record)."""

from __future__ import annotations

from conftest import full, group, make_manager, model

P = list(range(10))  # a shared prefix


def _computed(mgr, rid: str, tokens: list[int]) -> None:
    """``rid`` computes ``tokens`` (its pages join the index), then finishes."""
    mgr.add_request(rid, tokens)
    mgr.allocate(rid, len(tokens) - mgr.lookup(rid))
    mgr.append_tokens(rid, [7])
    mgr.free(rid)


def test_the_cached_prefix_memo_answers_anew_when_what_it_depends_on_changes(monkeypatch):
    mgr = make_manager(model(group("full", full(), 1)), 64)
    walks = []
    walk = mgr.prefix_lookup.fixed_point
    monkeypatch.setattr(mgr.prefix_lookup, "fixed_point", lambda *a, **kw: walks.append(1) or walk(*a, **kw))
    _computed(mgr, "a", P + [100])
    mgr.add_request("b", P + [200, 201, 202, 203, 204])
    walks.clear()
    assert [mgr.cached_tokens("b") for _ in range(3)] == [10, 10, 10]
    assert len(walks) == 1  # asked again with nothing changed: the memo answers
    assert mgr.cached_tokens("b", max_tokens=4) == 4  # another limit: walked again
    assert mgr.cached_tokens("b") == 10 and len(walks) == 3
    _computed(mgr, "c", P + [200, 201, 202, 203, 999])  # the index changes: b's prefix is longer now
    walks.clear()
    assert [mgr.cached_tokens("b") for _ in range(2)] == [14, 14] and len(walks) == 1
    mgr.free("b")
    mgr.add_request("b", [50, 51, 52, 53, 54, 55])  # a new record under the same id: no memo
    assert mgr.cached_tokens("b") == 0
    mgr.check_integrity()
