"""Bounding the LCM large page (the paper's named risk, §4.4).

Jenga's large page is ``S = lcm_g(P_g)`` over the groups' small pages.  With state groups (Mamba) the
LCM can be huge: Nemotron-H-8B's 256 KiB attention page and 49.4 MiB Mamba page give S = 395 MiB.
:func:`fit_page_sizes` adjusts the groups so that ``S <= max_ratio x`` the largest small page, using two
levers only:

(a) **scaling** ``tokens_per_page`` of attention groups (full / sliding / chunked / cross) by powers of two,
    up to ``max_tokens_per_page``; token counts stay multiples of the group's base ``tokens_per_page``,
    so prefix hashing at the base block keeps working;
(b) **padding** the small pages of state / vision groups (``mamba``, ``vision``) by at most
    ``max_pad_frac`` of their useful bytes.  Attention pages are never padded (paged kernels assume
    dense KV blocks).  Padding is added per layer in multiples of ``align_bytes`` so each per-layer
    slice stays integral and keeps its alignment; it is stored in :attr:`LayerGroup.pad_bytes`.

Among all plans meeting the bound, the one with the smallest large page wins; ties go to less scaling,
then less padding, then the smaller ratio.  Scaling never shrinks the large page, so ``tokens_per_page``
grows only when the bound cannot be met otherwise.  Padding can shrink it, so a plan may pad even when
the raw LCM already meets the bound (Nemotron-H: a 0.19% pad of the Mamba page makes S one Mamba page,
49.5 MiB instead of 395 MiB); pass ``max_pad_frac=0`` to forbid padding.  Modified plans are searched up
to a ratio of 128; beyond that only the unmodified plan is considered.  When no plan meets the bound,
:class:`PageSizeError` says the ratio reached and what to change.

**Widening** (``widen=True``, what :class:`~jenga.core.manager.manager.KVCacheManager` asks for when the defaults fail):
before refusing, the search is retried with (1) larger state pads, ``max_pad_frac`` raised step by step to
at most :data:`WIDE_PAD_FRAC` (only when padding is allowed at all, ``max_pad_frac > 0``) -- a state page
is held once per request, so its pad is cheap; then (2) token groups at any multiple ``m`` of their base
``tokens_per_page`` (3, 5, 6, 7, ... up to ``max_tokens_per_page``), not only powers of two, with the widest
pad.  The first step that fits wins, smallest large page within it.  Jamba-1.5-Mini at 64 tokens per page:
raw ratio 16, a 5.3% pad of the Mamba page gives 35 MiB at ratio 4.  When even the widened search fails,
:class:`PageSizeError` also lists the base page sizes (16 ... 256 tokens) that would fit.

**Splitting** (:func:`split_layer_groups`, what a pool of several models asks for when its composite plan fails):
a small page is ``n_g x p_g``, so a group's layer count is a factor of its page; models that share one pool
bring unrelated counts (Qwen3-Next-80B's 36 state layers, Gemma-3-27B's 52 sliding and 10 full), whose odd
factors (9, 13, 5) no small pad removes.  Splitting each group into sub-groups of power-of-two layer counts
(52 = 32 + 16 + 4) leaves only the per-layer sizes in the LCM: Qwen3-Next-80B + Gemma-3-27B in fp8 goes from
an LCM page of 19.14 GiB (520x) to 268 MiB (8x).  Sub-groups share the spec and see the same tokens, so they
hit, grow and free alike; each is one more page per block to manage.

Worked results (bf16, 16 tokens, defaults): Nemotron-H-8B 395.25 MiB -> 49.5 MiB (ratio 1, pad 0.19%);
Falcon-H1-7B ratio 16 -> 1 (pad 0.70%); Jamba-1.5-Mini 33.25 MiB, ratio 4, unchanged; Qwen3-Next
75.375 MiB, ratio 2, unchanged; Gemma-3-27B with its vision group raises (the 168 KiB vision page has a
factor 21 no small pad removes); without it 32.5 MiB, ratio 5.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import reduce

from jenga.core.specs import LayerGroup, ModelSpec
from jenga.errors import JengaError

__all__ = ["PADDABLE_KINDS", "SCALABLE_KINDS", "WIDE_PAD_FRAC", "PagePlan", "PageSizeError", "fit_page_sizes",
           "manager_page_plan", "split_layer_groups", "with_base_page"]

#: Kinds whose ``tokens_per_page`` may be scaled by powers of two.
SCALABLE_KINDS = frozenset({"full", "sliding", "chunked", "cross"})
#: Kinds whose small pages may be padded.
PADDABLE_KINDS = frozenset({"mamba", "vision"})

_MAX_SCALINGS = 4096  # beyond this many tokens_per_page combinations, only uniform scalings are tried
_MAX_R = 128  # largest S / (anchor page) enumerated; beyond it only the unmodified (raw) plan is considered
#: The widest state pad the widened search may use (fraction of a state page's useful bytes).
WIDE_PAD_FRAC = 0.10
_WIDE_PAD_STEPS = (0.02, 0.05, WIDE_PAD_FRAC)
_ADVICE_TOKENS = (16, 32, 64, 128, 256)


def with_base_page(model: ModelSpec, tokens_per_page: int) -> ModelSpec:
    """The model with every token group at ``tokens_per_page`` (state groups unchanged)."""
    groups = tuple(
        LayerGroup(g.name, g.spec, g.layers, tokens_per_page if g.spec.per_token else g.tokens_per_page,
                   g.pad_bytes) for g in model.groups)
    return ModelSpec(model.name, groups, model.max_model_len, model.num_layers, model.hf_config)


class PageSizeError(JengaError, ValueError):
    """No page plan keeps the large page within the requested ratio."""


@dataclass(frozen=True)
class PagePlan:
    """Result of :func:`fit_page_sizes`.

    ``model`` has the adjusted groups (``tokens_per_page``, ``pad_bytes``).  ``ratio`` is
    ``large_page_bytes / max_small_page_bytes``.  ``pad_bytes_per_large_page`` is the worst case over groups
    of the padding inside one large page split into that group's small pages; ``pad_frac`` is that
    divided by ``large_page_bytes``.  ``raw_*`` describe the input at its own tokens_per_page, unpadded.
    """

    model: ModelSpec
    large_page_bytes: int
    max_small_page_bytes: int
    ratio: float
    pad_bytes_per_large_page: int
    pad_frac: float
    raw_lcm_page_bytes: int
    raw_ratio: float

    @property
    def pages_per_large_page(self) -> dict[str, int]:
        """k_g = S / P_g per group name."""
        return {g.name: self.large_page_bytes // g.page_bytes for g in self.model.groups}


def split_layer_groups(model: ModelSpec) -> ModelSpec:
    """``model`` with every group of ``n`` layers split into sub-groups of power-of-two layer counts,
    largest first (52 layers: 32 + 16 + 4, in layer order), named ``"<group>.<i>"``; a group whose count
    is a power of two is kept as it is.  Same spec, tokens per page and per-layer pad (module docstring)."""
    groups = []
    for g in model.groups:
        n = g.num_layers
        if n & (n - 1) == 0:
            groups.append(g)
            continue
        start, i = 0, 0
        for bit in reversed(range(n.bit_length())):
            if n >> bit & 1:
                part = g.layers[start:start + (1 << bit)]
                pad = g.pad_bytes // n * len(part)
                groups.append(dataclasses.replace(g, name=f"{g.name}.{i}", layers=part, pad_bytes=pad))
                start, i = start + len(part), i + 1
    return dataclasses.replace(model, groups=tuple(groups))


@dataclass(frozen=True)
class _Candidate:
    key: tuple
    tokens: tuple[int, ...]
    pads: tuple[int, ...]  # total pad bytes per small page, per group


def _useful(g: LayerGroup, tokens: int) -> int:
    return g.spec.layer_page_bytes(tokens) * g.num_layers


def _scalings(groups: tuple[LayerGroup, ...], cap: int) -> list[tuple[tuple[int, ...], int]]:
    """Candidate (tokens_per_page vector, scaling cost) pairs, least total scaling first."""
    options = []
    for g in groups:
        opts = [g.tokens_per_page]
        if g.kind in SCALABLE_KINDS and g.spec.per_token:
            while opts[-1] * 2 <= cap:
                opts.append(opts[-1] * 2)
        options.append(opts)
    if math.prod(len(o) for o in options) > _MAX_SCALINGS:
        depth = max(len(o) for o in options)
        vectors = [tuple(o[min(e, len(o) - 1)] for o in options) for e in range(depth)]
    else:
        vectors = list(itertools.product(*options))
    base = [g.tokens_per_page for g in groups]
    costed = {v: sum((t // b).bit_length() - 1 for t, b in zip(v, base, strict=True)) for v in vectors}
    return sorted(costed.items(), key=lambda vc: vc[1])


def _fit_to(S: int, useful: int, step: int, frac: float) -> int | None:
    """Smallest page P' with P' | S, useful <= P' <= useful*(1+frac), (P' - useful) % step == 0."""
    limit = int(useful * (1 + frac))
    if S // useful - S // (limit + 1) <= (limit - useful) // step:  # fewer quotients than pads to try
        for k in range(S // useful, S // (limit + 1), -1):
            if S % k == 0 and S // k <= limit and (S // k - useful) % step == 0:
                return S // k
        return None
    for page in range(useful, limit + 1, step):
        if S % page == 0:
            return page
    return None


def _anchor_pages(useful: int, paddable: bool, m1: int, step: int, frac: float) -> Iterator[int]:
    """Ascending pages P' for the anchor group: ``P' % m1 == 0``, ``(P' - useful) % step == 0``, in budget.

    The two congruences are solved together (CRT), so the scan moves in steps of ``lcm(m1, step)``.
    """
    if not paddable:
        if useful % m1 == 0:
            yield useful
        return
    g = math.gcd(m1, step)
    if useful % g:
        return
    mod = step // g
    t = (useful // g) * pow(m1 // g, -1, mod) % mod if mod > 1 else 0
    period = m1 * mod
    x = m1 * t
    x += -(-(useful - x) // period) * period  # first solution >= useful
    limit = useful * (1 + frac)
    while x <= limit:
        yield x
        x += period


def _search_scaled(groups: tuple[LayerGroup, ...], tokens: tuple[int, ...], cost: int, max_ratio: float,
                   frac: float, align: int, pad_ok: list[bool], s_cap: int | None) -> _Candidate | None:
    """Smallest-S plan for one tokens_per_page vector (S <= s_cap when given)."""
    steps = [g.num_layers * align for g in groups]
    useful = [_useful(g, t) for g, t in zip(groups, tokens, strict=True)]
    fixed = [u for u, p in zip(useful, pad_ok, strict=True) if not p]
    L = reduce(math.lcm, fixed, 1)
    biggest_fixed = max(fixed, default=0)
    best: _Candidate | None = None
    for a, ua in enumerate(useful):
        if ua * (1 + frac if pad_ok[a] else 1) < biggest_fixed:
            continue  # this group can never be the largest page: another anchor covers the plan
        for r in range(1, int(min(max_ratio, _MAX_R)) + 1):
            bound = best.key[0] if best is not None else s_cap
            if bound is not None and r * ua > bound:
                break
            for pa in _anchor_pages(ua, pad_ok[a], L // math.gcd(L, r), steps[a], frac):
                S = r * pa
                if bound is not None and S > bound:
                    break
                pages = []
                for j, uj in enumerate(useful):
                    pj = pa if j == a else (_fit_to(S, uj, steps[j], frac) if pad_ok[j] else uj)
                    if pj is None or S % pj:
                        break
                    pages.append(pj)
                else:
                    pads = tuple(p - u for p, u in zip(pages, useful, strict=True))
                    worst = max(pad / p for pad, p in zip(pads, pages, strict=True))
                    cand = _Candidate((S, cost, worst, S / max(pages)), tokens, pads)
                    if best is None or cand.key < best.key:
                        best = cand
                    break  # a larger pa for this (anchor, r) only grows S
    return best


def _search(groups: tuple[LayerGroup, ...], max_ratio: float, frac: float, cap: int,
            align: int) -> _Candidate | None:
    """Best plan: unscaled if any fits, else the least scaling that fits (smallest S within it)."""
    raw = [_useful(g, g.tokens_per_page) for g in groups]
    raw_lcm = reduce(math.lcm, raw)
    pad_ok = [g.kind in PADDABLE_KINDS and frac > 0 for g in groups]
    raw_fits = raw_lcm <= max_ratio * max(raw)
    s_cap = raw_lcm if raw_fits else None
    level: int | None = None
    best = _Candidate((raw_lcm, 0, 0.0, raw_lcm / max(raw)), tuple(g.tokens_per_page for g in groups),
                      (0,) * len(groups)) if raw_fits else None
    for tokens, cost in _scalings(groups, cap):
        if best is not None and level is not None and cost > level:
            break
        cand = _search_scaled(groups, tokens, cost, max_ratio, frac, align, pad_ok, s_cap)
        if cand is not None and (best is None or cand.key < best.key):
            best = cand
        if best is not None:
            level = cost
    return best


def _multiplied(groups: tuple[LayerGroup, ...], m: int) -> tuple[LayerGroup, ...]:
    return tuple(dataclasses.replace(g, tokens_per_page=g.tokens_per_page * m)
                 if g.kind in SCALABLE_KINDS and g.spec.per_token else g for g in groups)


def _widened(groups: tuple[LayerGroup, ...], max_ratio: float, frac: float, cap: int,
             align: int) -> _Candidate | None:
    """Larger state pads first, then non-power-of-two multiples of the token groups' base page."""
    pads = [f for f in _WIDE_PAD_STEPS if f > frac] if frac > 0 else []
    for f in pads:
        if (c := _search(groups, max_ratio, f, cap, align)) is not None:
            return c
    wide = max(pads, default=frac)
    base = max((g.tokens_per_page for g in groups if g.kind in SCALABLE_KINDS and g.spec.per_token), default=0)
    for m in range(3, cap // base + 1 if base else 0):
        if m & (m - 1) == 0:
            continue  # powers of two were tried by the default search
        if (c := _search(_multiplied(groups, m), max_ratio, wide, cap, align)) is not None:
            return c
    return None


def _fitting_bases(groups: tuple[LayerGroup, ...], max_ratio: float, frac: float, cap: int, align: int,
                   widen: bool) -> list[int]:
    """Base tokens per page (``_ADVICE_TOKENS``) at which the same search would fit."""
    base = max((g.tokens_per_page for g in groups if g.kind in SCALABLE_KINDS and g.spec.per_token), default=0)
    out = []
    for t in _ADVICE_TOKENS:
        if not base or t == base or t > cap:
            continue
        gs = tuple(dataclasses.replace(g, tokens_per_page=t) if g.kind in SCALABLE_KINDS and g.spec.per_token
                   else g for g in groups)
        if _search(gs, max_ratio, frac, cap, align) or (widen and _widened(gs, max_ratio, frac, cap, align)):
            out.append(t)
    return out


def _advice(model: ModelSpec, groups: tuple[LayerGroup, ...], max_ratio: float, frac: float, cap: int,
            align: int, widen: bool = False) -> str:
    raw = [_useful(g, g.tokens_per_page) for g in groups]
    raw_ratio = reduce(math.lcm, raw) / max(raw)
    # best ratio reachable by padding alone; bounded effort (the r loop is capped), scaling left out
    reach = _search(groups, raw_ratio, frac, 0, align)
    reached = reach.key[3] if reach else raw_ratio
    parts = [f"{model.name}: no page plan keeps the large page within max_ratio={max_ratio:g}x the largest "
             f"small page; the best reachable ratio is {reached:.4g}x with max_pad_frac={frac:g} and "
             f"max_tokens_per_page={cap} (raw LCM {reduce(math.lcm, raw)} B = {raw_ratio:.4g}x). Small pages: "
             + ", ".join(f"{g.name}={r} B" for g, r in zip(groups, raw, strict=True)) + "."]
    for f2 in (0.02, 0.05, 0.1, 0.25):
        if f2 > frac and (c := _search(groups, max_ratio, f2, cap, align)) is not None:
            parts.append(f"max_pad_frac={f2:g} would fit (ratio {c.key[3]:.4g}).")
            break
    if len(groups) > 1:
        def without(i: int) -> float:
            rest = raw[:i] + raw[i + 1:]
            return reduce(math.lcm, rest) / max(rest)
        worst = min(range(len(groups)), key=without)
        parts.append(f"Without group {groups[worst].name!r} the raw ratio would be {without(worst):.4g}x.")
    parts.append(f"Or raise max_ratio to >= {math.ceil(reached)}.")
    if widen:
        parts.insert(1, f"Widened too: state pads up to {WIDE_PAD_FRAC:g} and token pages at any multiple of "
                        "their base size.")
        bases = _fitting_bases(groups, max_ratio, frac, cap, align, widen)
        parts.append(f"tokens_per_page {', '.join(map(str, bases))} would fit." if bases else
                     f"No tokens_per_page in {', '.join(map(str, _ADVICE_TOKENS))} would fit.")
    return " ".join(parts)


def fit_page_sizes(model: ModelSpec, *, max_ratio: float = 8.0, max_pad_frac: float = 0.01,
                   max_tokens_per_page: int = 1024, align_bytes: int = 16, widen: bool = False) -> PagePlan:
    """Adjust ``model``'s groups so ``lcm <= max_ratio x`` the largest small page (see module docstring).

    ``widen``: when the levers above cannot meet the bound, retry with larger state pads and non-power-of-two
    token pages before refusing (module docstring).

    Existing ``pad_bytes`` of the input are discarded (the search starts from unpadded pages).
    Raises ``ValueError`` for out-of-range arguments and :class:`PageSizeError` when no plan fits.
    """
    if not max_ratio >= 1:
        raise ValueError(f"max_ratio must be >= 1, got {max_ratio!r}")
    if not 0 <= max_pad_frac < 1:
        raise ValueError(f"max_pad_frac must be in [0, 1), got {max_pad_frac!r}")
    if max_tokens_per_page < 1 or align_bytes < 1:
        raise ValueError("max_tokens_per_page and align_bytes must be positive")
    groups = model.groups
    raw = [_useful(g, g.tokens_per_page) for g in groups]
    raw_lcm = reduce(math.lcm, raw)
    best = _search(groups, max_ratio, max_pad_frac, max_tokens_per_page, align_bytes)
    if best is None and widen:
        best = _widened(groups, max_ratio, max_pad_frac, max_tokens_per_page, align_bytes)
    if best is None:
        raise PageSizeError(_advice(model, groups, max_ratio, max_pad_frac, max_tokens_per_page, align_bytes,
                                    widen))
    new_groups = tuple(dataclasses.replace(g, tokens_per_page=t, pad_bytes=p)
                       for g, t, p in zip(groups, best.tokens, best.pads, strict=True))
    fitted = dataclasses.replace(model, groups=new_groups)
    S = fitted.large_page_bytes
    assert S == best.key[0], (S, best)
    pad_large = max((S // g.page_bytes) * g.pad_bytes for g in new_groups)
    return PagePlan(model=fitted, large_page_bytes=S, max_small_page_bytes=fitted.max_small_page_bytes,
                    ratio=S / fitted.max_small_page_bytes, pad_bytes_per_large_page=pad_large,
                    pad_frac=pad_large / S, raw_lcm_page_bytes=raw_lcm, raw_ratio=raw_lcm / max(raw))


def manager_page_plan(model: ModelSpec, max_ratio: float = 8.0) -> PagePlan:
    """The plan :class:`~jenga.core.manager.manager.KVCacheManager` uses: the defaults; failing that, vision-embedding pages
    (alive only while an image is prefilled) may pad up to 25%, and the search is widened."""
    try:
        return fit_page_sizes(model, max_ratio=max_ratio)
    except PageSizeError:
        vision = any(g.kind == "vision" for g in model.groups)
        return fit_page_sizes(model, max_ratio=max_ratio, max_pad_frac=0.25 if vision else 0.01, widen=True)
