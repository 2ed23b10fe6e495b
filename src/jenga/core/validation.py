"""Checks of caller input, run before any state changes (each raises a typed ``JengaError``).

Token ids: a request's ids are kept as a flat ``uint32`` array (``token_array``), so the
common case -- a list of Python ints in range -- costs one C conversion (it rejects non-integers
and ids out of range) and a vectorised look at the ids 0 and 1 (where a bool could hide); only
input that fails it is walked in Python, to convert numpy integers or to name the first bad id
and its position.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Mapping
from typing import Any

import numpy as np

from jenga.errors import ConfigError, InvalidArgumentError, JengaError

TOKEN_ID_LIMIT = 1 << 32  # token ids are in [0, 2**32)
assert array("I").itemsize == 4, "the fast token-id check needs a 4-byte unsigned int"


def _fast_array(ids: Any) -> array | None:
    """``ids`` as a new ``uint32`` array when they are all ints in range, else ``None`` (a check
    in C for lists and tuples -- the array conversion rejects non-integers and ids out of range,
    bools are looked for among the ids 0 and 1 only --, and a vectorised one for integer numpy
    arrays)."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            return None
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= TOKEN_ID_LIMIT):
            return None
        out = array("I")
        out.frombytes(ids.astype(np.uint32, copy=False).tobytes())
        return out
    try:
        out = array("I", ids)  # in C: each id an int (or has __index__) in [0, 2**32)
    except (TypeError, OverflowError):
        return None
    if type(ids) is range:
        return out
    if len(out) <= 16 and all(type(t) is int for t in ids):  # a few ids (a decode step, a chunk's none)
        return out
    small = np.flatnonzero(np.frombuffer(out, dtype=np.uint32) <= 1)  # where a bool could hide
    if small.size and any(type(ids[i]) is not int for i in small.tolist()):
        return None  # a bool, or a numpy integer 0 / 1: named or converted by the slow path
    return out


def _slow_ids(ids: Any, what: str) -> list[int]:
    """The ids as Python ints, or ``InvalidArgumentError`` naming the first bad one."""
    out = []
    for pos, t in enumerate(ids):
        try:
            t = _index(t)
        except TypeError:
            raise InvalidArgumentError(f"{what}: token id {t!r} ({type(t).__name__}) at position {pos} "
                                       "is not an int") from None
        if not 0 <= t < TOKEN_ID_LIMIT:
            raise InvalidArgumentError(f"{what}: token id {t} at position {pos} is outside [0, 2**32)")
        out.append(t)
    return out


def _as_sequence(ids: Any, what: str) -> Any:
    """A list, tuple, range or numpy array of the ids (other iterables and tensors: a list)."""
    if type(ids) in (list, tuple, range) or isinstance(ids, np.ndarray):
        return ids
    if isinstance(ids, (str, bytes, Mapping)) or not hasattr(ids, "__iter__"):
        raise InvalidArgumentError(f"{what}: token ids must be a sequence of ints, got {type(ids).__name__}")
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)  # torch: Python ints


def token_array(ids: Any, what: str) -> array:
    """A new ``uint32`` array (``array("I")``) of ``ids`` (a list, tuple, range, numpy array, ...)
    if they are all ints in ``[0, 2**32)`` (numpy integers count, bools do not); raises
    ``InvalidArgumentError`` naming the first bad id, its position and ``what``.  For a list of
    Python ints this is one conversion in C plus a vectorised look at the ids 0 and 1."""
    ids = _as_sequence(ids, what)
    out = _fast_array(ids)
    return array("I", _slow_ids(ids, what)) if out is None else out


def checked_token_ids(ids: Any, what: str) -> list[int]:
    """``ids`` if it is a list of ints in ``[0, 2**32)``, else a new list of the same ids (from a
    tuple, range, numpy array, numpy integers); raises ``InvalidArgumentError`` naming the first bad id, its
    position and ``what`` (e.g. ``"request 'r1' prompt"``)."""
    ids = _as_sequence(ids, what)
    out = _fast_array(ids)
    if out is None:
        return _slow_ids(ids, what)
    return ids if type(ids) is list else out.tolist()


def checked_images(images: Any, prompt_len: int, in_sequence: bool, what: str) -> list[tuple[int, int, str]]:
    """``(offset, num_tokens, content_hash)`` triples: offset an int in ``[0, prompt_len]``,
    ``num_tokens`` a positive int, a non-empty str hash; ``in_sequence`` (the model embeds image
    tokens in the text) also requires ``offset + num_tokens <= prompt_len``.  Cross-attention
    images only need their image-token position inside the prompt: their tokens are the encoder's."""
    out = []
    for j, img in enumerate(images):
        if isinstance(img, (str, bytes)) or not hasattr(img, "__len__") or len(img) != 3:
            raise InvalidArgumentError(f"{what}: image {j} must be (offset, num_tokens, content_hash), got {img!r}")
        off, n, h = img
        try:
            off, n = _index(off), _index(n)
        except TypeError:
            off = None
        if off is None or not isinstance(h, str) or not h:
            raise InvalidArgumentError(f"{what}: image {j} {tuple(img)!r} needs int offset, int num_tokens "
                                       "and a non-empty str content_hash")
        if off < 0 or n <= 0 or off > prompt_len:
            raise InvalidArgumentError(f"{what}: bad image {j} {tuple(img)!r} for a {prompt_len}-token prompt "
                                       "(offset in [0, len], num_tokens > 0)")
        if in_sequence and off + n > prompt_len:
            raise InvalidArgumentError(f"{what}: image {j} covers tokens [{off}, {off + n}), past the "
                                       f"{prompt_len}-token prompt")
        out.append((off, n, h))
    return out


def _index(x: Any) -> int:
    """``x`` as an int: ints and integer types (numpy), never bools; ``TypeError`` otherwise."""
    if type(x) is int:
        return x
    if isinstance(x, bool) or type(x).__name__ == "bool_":
        raise TypeError("bool")
    return operator.index(x)


def checked_salt(salt: Any) -> str | None:
    """A cache salt: ``None`` (no tenant) or a string (``""`` is its own tenant, distinct from ``None``)."""
    if salt is not None and not isinstance(salt, str):
        raise InvalidArgumentError(f"cache_salt must be a str or None, got {type(salt).__name__}")
    return salt


def checked_int(value: Any, name: str, *, minimum: int = 1) -> int:
    """``value`` if it is an int (not a bool) ``>= minimum``; else ``InvalidArgumentError`` naming ``name``."""
    try:
        value = _index(value)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an int, got {value!r} ({type(value).__name__})") from None
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    return value


#: Config fields checked before transformers parses a config (top level or a sub-config such as
#: ``text_config``): transformers replaces ``num_key_value_heads: 0`` by the head count and divides by
#: ``num_attention_heads``.  Other sizes (``head_dim: 0`` is some families' "derive it") are checked
#: after parsing, by :mod:`jenga.structure`.  A list (per-layer sizes) or dict is checked item by item.
SIZE_FIELDS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers")


def check_config_sizes(raw: Mapping[str, Any], where: str = "config", error: type[JengaError] = ConfigError) -> None:
    """Raise ``ConfigError`` naming the first :data:`SIZE_FIELDS` entry of ``raw`` (or of a nested
    sub-config) that is not a positive integer (or ``error``, a subclass the caller prefers) -- before transformers fills in defaults for it
    (``num_key_value_heads: 0`` would silently become ``num_attention_heads``) or divides by it."""
    for field in SIZE_FIELDS:
        config_size(raw, field, where=where, error=error)
    for key, sub in raw.items():
        if isinstance(sub, Mapping):
            check_config_sizes(sub, f"{where}: {key}", error)


def config_size(cfg: Any, field: str, default: Any = None, *, where: str = "config",
                error: type[JengaError] = ConfigError) -> Any:
    """A size field of a model config (object or dict): ``default`` when absent or null, else a
    positive int -- ``0``, negatives, bools and non-integers raise ``ConfigError`` naming the field
    (instead of being silently replaced by the default)."""
    value = cfg.get(field) if isinstance(cfg, Mapping) else getattr(cfg, field, None)
    if value is None:
        return default
    if isinstance(value, (list, tuple, Mapping)):  # per-layer (or per-part) sizes
        items = value.values() if isinstance(value, Mapping) else value
        for v in items:
            config_size({field: v}, field, where=where, error=error)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value <= 0:
        raise error(f"{where}: {field!r} must be a positive integer, got {value!r}")
    return int(value)
