"""Flat per-page state: ``array('q')`` / ``bytearray`` buffers (fast one-element access from
Python) read and written in bulk through numpy views made on demand (a view costs about a
microsecond; none is kept, so ``copy.deepcopy`` of a manager copies plain buffers)."""

from __future__ import annotations

import struct
from array import array

import numpy as np

#: the smallest int64 (no key)
LOWEST = np.iinfo(np.int64).min

#: runs longer than this are changed with numpy; shorter ones element by element (each numpy
#: call costs about a microsecond, a Python step per element a tenth of that)
BULK = 64


def zeros(n: int) -> array:
    """An ``array('q')`` of ``n`` zeros."""
    return array("q", bytes(8 * n))


def view(buf: array | bytearray) -> np.ndarray:
    """A numpy view of ``buf``'s memory (int64 for ``array('q')``, uint8 for a bytearray)."""
    return np.frombuffer(buf, dtype=np.uint8 if type(buf) is bytearray else np.int64)


def as_ids(xs) -> np.ndarray:
    """``xs`` (a list, tuple, range or array of ints) as an int64 numpy array."""
    if type(xs) is list:
        return int64s(xs)
    if type(xs) is range:
        return np.arange(xs.start, xs.stop, xs.step, dtype=np.int64)
    return np.asarray(xs, dtype=np.int64)


def int64s(xs: list[int]) -> np.ndarray:
    """A list of ints as a new int64 numpy array, in one C pass: ``struct`` packs about three
    times faster than ``array('q', xs)`` or ``np.asarray`` convert.  Raises ``struct.error`` on
    an element that is not an int (a None: the callers' fallback)."""
    out = np.empty(len(xs), dtype=np.int64)
    struct.pack_into(f"{len(xs)}q", out, 0, *xs)
    return out


def unique_counts(xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(xs, return_counts=True)``, without a sort when ``xs`` is already in order
    (a request's pages, large page after large page)."""
    if len(xs) < 2:
        return xs.copy(), np.ones(len(xs), dtype=np.int64)
    if not (xs[1:] >= xs[:-1]).all():
        xs = np.sort(xs)
    starts = np.flatnonzero(np.concatenate(([True], xs[1:] != xs[:-1])))
    return xs[starts], np.diff(np.append(starts, len(xs)))


def largest_keys(cached: np.ndarray, kt: np.ndarray, kn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row (a large page's slots): the largest ``(t, n)`` key among its cached slots."""
    k = cached.shape[1]
    if k > 8:
        tt = np.where(cached, kt, LOWEST)
        ts = tt.max(axis=1)
        return ts, np.where(cached & (tt == ts[:, None]), kn, LOWEST).max(axis=1)
    ts, ns = np.where(cached[:, 0], kt[:, 0], LOWEST), np.where(cached[:, 0], kn[:, 0], LOWEST)
    for j in range(1, k):  # a few slots: column by column (a reduction along a short axis is slow)
        t, n = kt[:, j], kn[:, j]
        better = cached[:, j] & ((t > ts) | ((t == ts) & (n > ns)))
        ts, ns = np.where(better, t, ts), np.where(better, n, ns)
    return ts, ns
