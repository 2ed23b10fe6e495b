"""A finished request's block hashes, kept where the garbage collector does not walk them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np


class HashChain:
    """The block hashes of a request that is gone (``h_i`` names its prefix ``[0, (i + 1) *
    block)``, ``jenga.core.prefix.hashing``), read as the list they were: ``len``, an index, a slice
    (a new ``list``), iteration, equality with a list.  Never changes.

    Stored in a numpy object array: Python's cyclic garbage collector walks every element of
    every list it tracks, numpy arrays not at all, and the hash memo keeps up to 512 prompts'
    hashes (a 20k-token article has 1,250, a 100k-token prompt 6,250) -- as lists, each
    collection that finds them young (or every full one) visits them all.  The elements are
    the same ``bytes`` objects (the prefix index's keys); bytes cannot form reference cycles.
    """

    __slots__ = ("_arr",)

    def __init__(self, hashes: Sequence[bytes]):
        self._arr = np.empty(len(hashes), dtype=object)
        self._arr[:] = hashes

    def __len__(self) -> int:
        return len(self._arr)

    def __getitem__(self, i):
        if type(i) is int:
            return self._arr[i]  # IndexError past either end, as a list
        return self._arr[i].tolist()

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._arr.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HashChain):
            other = other[:]
        return isinstance(other, list) and self[:] == other

    __hash__ = None  # compared by value, like a list

    def __repr__(self) -> str:
        return f"HashChain({self[:]!r})"
