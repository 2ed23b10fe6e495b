"""A prompt borrows a recent prompt's block hashes over their common token prefix
(``HashMemo.lend``): its hashes are exactly those hashing gives, for any shared length, salt,
donor still computing, and split of the hashing into calls."""

from __future__ import annotations

import gc
import random
from array import array

import pytest
from conftest import full, group, make_manager, model, serve

from jenga.core.prefix.index import HashChain, HashMemo, extend_block_hashes, root_hash


def _chain(tokens, block, salt=None, stop=None):
    out: list[bytes] = []
    extend_block_hashes(out, array("I", tokens), block, root_hash(salt), stop=stop)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_lent_hashes_equal_hashing(seed):
    rng = random.Random(seed)
    block = rng.choice([1, 2, 4, 16])
    base = [rng.randrange(2**32) for _ in range(rng.randrange(1, 12) * block + rng.randrange(block))]
    shared = rng.randrange(block, len(base) + 1)
    other = base[:shared] + [rng.randrange(2**32) for _ in range(rng.randrange(0, 6 * block))]
    common = next((i for i, (x, y) in enumerate(zip(base, other, strict=False)) if x != y), min(len(base), len(other)))
    d_tokens = array("I", base)
    d_hashes = _chain(base, block, "s", stop=rng.randrange(1, len(base) // block + 2))  # a donor still computing
    tokens, hashes = array("I", other), _chain(other, block, "s", stop=1)
    want = _chain(other, block, "s")
    stop = rng.randrange(1, len(other) // block + 2)
    HashMemo.lend((d_tokens, d_hashes), tokens, hashes, block, stop)
    assert len(hashes) == max(1, min(stop, len(d_hashes), common // block, len(other) // block))
    assert hashes == want[:len(hashes)]
    for stop in sorted(rng.sample(range(1, len(other) // block + 2), k=min(3, len(other) // block + 1))):
        HashMemo.lend((d_tokens, d_hashes), tokens, hashes, block, stop)  # later calls: never past stop
        assert hashes == want[:len(hashes)] and len(hashes) <= max(1, stop, len(hashes))
        extend_block_hashes(hashes, tokens, block, root_hash("s"), stop=stop)
    extend_block_hashes(hashes, tokens, block, root_hash("s"))
    assert hashes == want
    other_salt = _chain(other, block, "t", stop=1)
    HashMemo.lend((d_tokens, d_hashes), tokens, other_salt, block, len(other) // block)
    assert len(other_salt) == 1  # another tenant's chain: nothing lent


def _spec():
    return model(group("full", full(), 2), max_len=1 << 16)


def test_a_prompt_sharing_a_prefix_borrows_exactly_the_shared_blocks():
    mgr = make_manager(_spec(), 4096, tokens_per_page=16)
    article = list(range(1000, 1000 + 16 * 40 + 5))
    serve(mgr, "a", article + [1, 2, 3], [7], free=False)  # live donor: 40 blocks of article + 1
    mgr.add_request("b", article + [4, 5, 6] * 9)
    hit = mgr.lookup("b")
    b = mgr.requests["b"]
    a = mgr.requests["a"]
    assert b.lender is not None and b.lender[1] is a.hashes  # borrowed from "a"
    assert hit == 40 * 16
    assert b.hashes == _chain(b.tokens, 16)[:len(b.hashes)] and b.hashes[:40] == a.hashes[:40]
    mgr.allocate("b", len(b.tokens) - hit)
    mgr.append_tokens("b", [9])
    assert b.hashes == _chain(b.tokens, 16) and len(b.hashes) > len(a.hashes) == 40  # its own tail hashed
    mgr.check_integrity()


def test_no_lending_across_salts_or_with_images():
    mgr = make_manager(_spec(), 4096, tokens_per_page=16)
    prompt = list(range(50, 50 + 16 * 8))
    serve(mgr, "a", prompt, [1], salt="x")
    mgr.add_request("b", prompt, cache_salt="y")
    assert mgr.lookup("b") == 0
    assert mgr.requests["b"].lender is None  # another tenant's first hash: no donor
    assert mgr.requests["b"].hashes == _chain(prompt, 16, "y", stop=7)
    mgr.add_request("c", prompt, cache_salt="x")
    mgr.lookup("c")
    assert mgr.requests["c"].lender is not None
    assert mgr.requests["c"].hashes == _chain(prompt, 16, "x", stop=7)


def test_hash_chain_reads_as_the_list_it_holds():
    """``HashChain`` (a freed prompt's hashes) answers ``len``, indexes (negative too, and
    IndexError past the ends), slices (any step, clipped), iteration and equality exactly as
    the list it was made from, with the same objects."""
    rng = random.Random(3)
    for n in (0, 1, 5, 64):
        ref = [rng.randbytes(16) for _ in range(n)]
        chain = HashChain(ref)
        assert len(chain) == n and chain == ref and list(chain) == ref and bool(chain) == bool(ref)
        assert chain != ref + [b"x"] and chain == HashChain(list(ref))
        for _ in range(40):
            a, b, c = rng.randrange(-70, 70), rng.randrange(-70, 70), rng.choice([1, 2, 3, -1, -16, None])
            assert chain[a:b:c] == ref[a:b:c]
        for i in range(-n, n):
            assert chain[i] is ref[i]
        for i in (n, -n - 1):
            with pytest.raises(IndexError):
                chain[i]


def test_freed_prompt_lends_from_its_frozen_hashes():
    """A freed donor's hashes move into the memo as a ``HashChain`` (also as the donor, in its
    place); a new prompt still borrows them, a re-add still recalls them (as a list)."""
    mgr = make_manager(_spec(), 4096, tokens_per_page=16)
    article = list(range(1000, 1000 + 16 * 40 + 5))
    serve(mgr, "a", article, [7])  # computed and freed
    want = _chain(article + [7], 16)
    donor = mgr.hasher.memo.donor(want[0])
    assert type(donor[1]) is HashChain and donor[1] == want
    assert not gc.is_tracked(donor[1]._arr)  # no collection walks its hashes
    mgr.add_request("b", article[:16 * 30] + [4, 5, 6] * 9)
    assert mgr.lookup("b") == 30 * 16
    b = mgr.requests["b"]
    assert b.lender is donor and b.hashes == _chain(b.tokens, 16)[:len(b.hashes)]
    mgr.add_request("a", article + [7])  # a re-add: its hashes recalled
    assert type(mgr.requests["a"].hashes) is list and mgr.requests["a"].hashes == want
    mgr.check_integrity()
