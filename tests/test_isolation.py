"""Tenant isolation and image-aware block hashes (issue 7, item 3): regression tests."""

from __future__ import annotations

import pytest
from conftest import cross, full, group, make_manager, model, serve, toy_model, vision

from jenga.core.prefix.index import extend_block_hashes, image_key, root_hash
from jenga.core.request import ImageRef
from jenga.errors import InvalidArgumentError


def vision_model():
    return model(group("full", full(), 1), group("vis", vision(64), 1, first_layer=1))


@pytest.mark.parametrize("spec", [toy_model(), vision_model()], ids=["cross-attention", "vision-embedding"])
def test_image_pages_never_shared_across_salts(spec):
    mgr = make_manager(spec, 64)
    cat = ImageRef(1, 3, "cat")
    serve(mgr, "a", [1, 2, 3, 4, 5], [6], images=[cat], salt="tenant-a")
    cached_a = mgr.stats().cached_bytes
    assert cached_a > 0
    for rid, salt, shared in (("b", "tenant-b", False), ("c", None, False), ("d", "", False),
                              ("e", "tenant-a", True)):
        mgr.add_request(rid, [9, 8, 7, 6, 5], images=[cat], cache_salt=salt)  # other text: only the image
        t = mgr.allocate(rid, 5)
        img_table = t.groups[1]
        assert img_table.pages.get(0), rid
        # the image runs through the encoder again unless its pages are this tenant's
        assert (img_table.to_fill == set()) is shared, rid
        mgr.append_tokens(rid, [1])
        mgr.free(rid)
        mgr.check_integrity()


def test_image_key_depends_on_salt_and_size_not_on_offset():
    img = ImageRef(3, 4, "cat")
    r1, r2 = root_hash("x"), root_hash("y")
    assert image_key(r1, img, 0) != image_key(r2, img, 0)
    assert image_key(r1, img, 0) == image_key(r1, ImageRef(9, 4, "cat"), 0)  # shared wherever it sits
    assert image_key(r1, img, 0) != image_key(r1, ImageRef(3, 5, "cat"), 0)
    assert image_key(r1, img, 0) != image_key(r1, img, 1)


def _hashes(tokens, images, block=4, salt=None):
    out: list[bytes] = []
    extend_block_hashes(out, tokens, block, root_hash(salt), [ImageRef(*i) for i in images])
    return out


@pytest.mark.parametrize("other", [
    [(2, 1, "a"), (3, 1, "bc")],  # "ab","c" vs "a","bc": same offsets and lengths, hashes re-split
    [(1, 1, "ab"), (3, 1, "c")],  # first image at another offset
    [(2, 2, "ab"), (3, 1, "c")],  # first image of another length (overlapping is fine for hashing)
    [(2, 1, "abc")],  # one image whose hash is the concatenation
])
def test_block_hash_frames_image_offset_length_and_hash(other):
    tokens = list(range(10, 18))
    base = [(2, 1, "ab"), (3, 1, "c")]
    assert _hashes(tokens, base) == _hashes(tokens, base)
    assert _hashes(tokens, base)[0] != _hashes(tokens, other)[0]
    # a block no image touches hashes as plain text, whatever the images elsewhere
    assert _hashes(tokens[:4], [(5, 1, "x")])[0] == _hashes(tokens[:4], [])[0]


def test_image_at_another_offset_or_length_gets_no_prefix_hit():
    prompt = list(range(100, 120))
    mgr = make_manager(vision_model(), 256, tokens_per_page=4)
    serve(mgr, "a", prompt, [1], images=[(5, 3, "cat")])
    for rid, img, hit in (("same", (5, 3, "cat"), 16), ("offset", (6, 3, "cat"), 4), ("length", (5, 4, "cat"), 4),
                          ("block-offset", (4, 3, "cat"), 4)):
        mgr.add_request(rid, prompt, images=[img])
        assert mgr.lookup(rid) == hit, rid  # block 0 (tokens 0-3) holds no image: it may hit
        mgr.free(rid)
    mgr.check_integrity()


def test_salt_none_and_empty_string_are_distinct_tenants():
    assert root_hash(None) != root_hash("")
    mgr = make_manager(model(group("a", full(), 1), group("x", cross(), 1, first_layer=1)), 64)
    serve(mgr, "a", [1, 2, 3, 4, 5], [6], salt=None)
    for rid, salt, hit in (("b", "", 0), ("c", None, 4)):
        mgr.add_request(rid, [1, 2, 3, 4, 5], cache_salt=salt)
        assert mgr.lookup(rid) == hit, rid
        mgr.free(rid)
    serve(mgr, "d", [7, 8, 9, 10, 11], [6], salt="")
    mgr.add_request("e", [7, 8, 9, 10, 11], cache_salt="")
    assert mgr.lookup("e") == 4
    with pytest.raises(InvalidArgumentError, match="cache_salt"):
        mgr.add_request("f", [1, 2], cache_salt=7)
    mgr.check_integrity()


def test_block_hash_is_the_documented_blake2b_chain():
    """h_i = blake2b(h_{i-1} || tokens_i as little-endian uint32)[:16] from the salt's root: a
    cryptographic chain (a weaker hash swapped in fails here), the same for a list, a uint32
    array, and any split of the hashing into calls."""
    import hashlib
    import struct
    from array import array

    tokens = [0, 1, 2**32 - 1, 7, 65536, 3, 3, 3] * 5  # 40 tokens: 10 blocks of 4, 2**32 - 1 included
    expect, parent = [], root_hash("t")
    for i in range(10):
        parent = hashlib.blake2b(parent + struct.pack("<4I", *tokens[4 * i:4 * i + 4])).digest()[:16]
        expect.append(parent)
    assert _hashes(tokens, [], salt="t") == expect
    split: list[bytes] = []
    for stop in (1, 4, 4, 9, 10):
        extend_block_hashes(split, array("I", tokens), 4, root_hash("t"), stop=stop)
    assert split == expect
    assert _hashes(tokens, [], salt="u")[0] != expect[0]  # another tenant: another chain


@pytest.mark.parametrize("bad", [-1, 2**32])
def test_block_hash_rejects_ids_outside_uint32(bad):
    """A list id that does not fit a uint32 raises instead of wrapping onto another id's bytes."""
    with pytest.raises(OverflowError):
        _hashes([1, 2, 3, bad], [])


def test_block_hashes_equal_only_for_identical_prefixes():
    """Keys name the whole prefix: a change in any earlier block changes every later key, and
    equal blocks at other depths, or one token moved across a block edge, never share a key."""
    base = list(range(40))
    h = _hashes(base, [])
    assert len(set(h)) == len(h)
    changed = _hashes([99] + base[1:], [])
    assert all(a != b for a, b in zip(h, changed, strict=True))
    repeated = _hashes([5, 6, 7, 8] * 3, [])
    assert len(set(repeated)) == 3  # the same block at depths 0, 1, 2: three keys
    moved = _hashes(base[:3] + [base[4], base[3]] + base[5:], [])
    assert moved[0] != h[0] and moved[1] != h[1]
