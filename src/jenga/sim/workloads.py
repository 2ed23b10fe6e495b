"""Seeded synthetic request traces shaped like the paper's §7 workloads (nothing is downloaded).

Every generator takes ``num_requests``, ``rate`` (req/s, Poisson arrivals; ``math.inf`` puts
every request at t = 0, as the paper's throughput runs do), ``seed`` and ``max_len`` (the
model's maximum length: ``prompt_len + output_len <= max_len``), and returns a
:class:`Workload` — a ``list`` of :class:`SimRequest` in arrival order with an ``info``
(:class:`WorkloadInfo`).  Lengths, arrivals and content ids come from independent child
streams of ``np.random.SeedSequence(seed)``, so changing ``rate`` never changes lengths.
Poisson arrivals start at 0 and then add Exp(1/rate) gaps.

Length statistics (tokens; defaults):

============================  =====================================================  ===========
name                          prompt                                                 output
============================  =====================================================  ===========
``mmlu-pro``                  lognormal, mean 300, sigma 0.7, clipped to [16, 3076]  20 (Jamba run)
``arxiv-qa``                  lognormal, median 94,400, sigma 0.6, clipped to         150
                              [1024, max_len - 150]; mean 92.4k at max_len 131072
                              (paper: Ministral mean input 92,408; ~29% at the cap)
``mmmu-pro``                  1 + Poisson(42) text (mean 43) + one image of 1601 x    200
                              tiles tokens, tiles in {1,2,3,4} w.p. .01/.01/.08/.90
                              (mean 6,196 ~ paper 6,193)
``arxiv-multiq``              the artifact's documents (groups of papers, capped at   150
                              ``max_prompt_len``) as shared prefixes + 20 +
                              Poisson(10) question tokens (:mod:`.artifact_workloads`)
``mmlu-pro-5shot``            5-shot CoT prompts, 14 subjects sharing a few-shot      20
                              prefix, mean ~1,270 (:mod:`.artifact_workloads`)
``ministral-static``          U(16384, 114688), mean 65,536                           150
``ministral-dynamic``         U(7/8 m, 9/8 m), m sweeping 16384 -> 114688 linearly    150
                              over arrival order (overall mean 65,536)
``decode-batch-20``           20 requests at t = 0, U(55k, 110k)                      U(50, 100)
``spec-decode``               ``mmlu-pro`` (or ``base=`` another workload);           as base
                              info: 3 speculative tokens, acceptance 0.7
============================  =====================================================  ===========

:mod:`jenga.sim.traces` reads and writes traces as JSONL, one JSON object per line.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

#: Token ids below this are left for special tokens (BOS, image placeholders, ...).
FIRST_TOKEN_ID = 16
#: Image tokens per mllama tile (40 x 40 patches + CLS); up to 4 tiles per image.
MLLAMA_TOKENS_PER_TILE = 1601
_TILE_PROBS = (0.01, 0.01, 0.08, 0.90)  # P(tiles = 1..4): mean 3.87 tiles = 6,196 tokens
ARXIV_MEDIAN, ARXIV_SIGMA, ARXIV_MIN = 94_400, 0.6, 1024
MMLU_MAX = 3076


class InvalidRequestError(ValueError):
    """A :class:`SimRequest` field is out of range or inconsistent."""


class UnknownWorkloadError(KeyError):
    """``get_workload`` got a name not in :data:`WORKLOAD_NAMES`."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown workload"


def _stable_int(*parts: object) -> int:
    """A 64-bit integer from ``parts`` that is stable across processes (unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


def _token_stream(seed: int, vocab_size: int, n: int, *key: object) -> np.ndarray:
    rng = np.random.default_rng([seed & (2**63 - 1), _stable_int(*key)])
    return rng.integers(FIRST_TOKEN_ID, vocab_size, size=n, dtype=np.int64)


@dataclass(slots=True)
class SimRequest:
    """One request of a trace.

    ``prompt_len`` counts every prompt position, image tokens included.  The first
    ``prefix_len`` tokens are identical for all requests with the same ``prefix_id``.
    ``images`` holds ``(offset, num_tokens, content_hash)`` spans inside the prompt, sorted and
    disjoint; equal hashes mean equal image content (and equal token ids).
    """

    request_id: str
    arrival_s: float
    prompt_len: int
    output_len: int
    prefix_id: str | None = None
    prefix_len: int = 0
    images: tuple[tuple[int, int, str], ...] = ()

    def __post_init__(self) -> None:
        rid = self.request_id
        for name in ("prompt_len", "output_len", "prefix_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise InvalidRequestError(f"request {rid}: {name} must be an integer, got {v!r}")
        if self.prompt_len < 1 or self.output_len < 1:
            raise InvalidRequestError(f"request {rid}: prompt_len and output_len must be >= 1, "
                                      f"got {self.prompt_len}, {self.output_len}")
        if not (isinstance(self.arrival_s, (int, float)) and math.isfinite(self.arrival_s)
                and self.arrival_s >= 0):
            raise InvalidRequestError(f"request {rid}: arrival_s must be finite and >= 0, got {self.arrival_s!r}")
        if not 0 <= self.prefix_len <= self.prompt_len:
            raise InvalidRequestError(f"request {rid}: prefix_len {self.prefix_len} not in [0, prompt_len "
                                      f"{self.prompt_len}]")
        if self.prefix_len and self.prefix_id is None:
            raise InvalidRequestError(f"request {rid}: prefix_len {self.prefix_len} needs a prefix_id")
        end = 0
        for img in self.images:
            if len(img) != 3:
                raise InvalidRequestError(f"request {rid}: image {img!r} is not (offset, num_tokens, hash)")
            off, n, h = img
            if not (isinstance(off, (int, np.integer)) and isinstance(n, (int, np.integer))) or isinstance(
                    off, bool):
                raise InvalidRequestError(f"request {rid}: image {img!r} offset and num_tokens must be integers")
            if off < end or n < 1 or off + n > self.prompt_len or not isinstance(h, str) or not h:
                raise InvalidRequestError(f"request {rid}: image {img!r} must be a sorted, disjoint span "
                                          f"inside the prompt with a non-empty hash string")
            end = off + n

    def prompt_token_ids(self, vocab_size: int = 32000, seed: int = 0) -> np.ndarray:
        """Deterministic int64 prompt ids in ``[FIRST_TOKEN_ID, vocab_size)``.

        Prefix tokens depend only on ``(seed, prefix_id)``, image spans only on
        ``(seed, content_hash)``, the rest on ``(seed, request_id)``.
        """
        if vocab_size <= FIRST_TOKEN_ID:
            raise InvalidRequestError(f"vocab_size must exceed {FIRST_TOKEN_ID}, got {vocab_size}")
        ids = _token_stream(seed, vocab_size, self.prompt_len, "request", self.request_id)
        if self.prefix_len:
            ids[:self.prefix_len] = _token_stream(seed, vocab_size, self.prefix_len, "prefix", self.prefix_id)
        for off, n, h in self.images:
            ids[off:off + n] = _token_stream(seed, vocab_size, n, "image", h)
        return ids

    def to_dict(self) -> dict:
        """The JSONL form read by :func:`jenga.sim.traces.load_jsonl`."""
        return {"request_id": self.request_id, "arrival": self.arrival_s, "prompt_len": int(self.prompt_len),
                "output_len": int(self.output_len), "prefix_id": self.prefix_id,
                "prefix_len": int(self.prefix_len), "images": [[int(o), int(n), h] for o, n, h in self.images]}


@dataclass(frozen=True)
class WorkloadInfo:
    """Workload-level facts: generator name and arguments, speculative-decoding settings."""

    name: str
    seed: int | None = None
    rate: float = math.inf
    max_len: int | None = None
    num_spec_tokens: int = 0
    acceptance: float | None = None
    params: dict = field(default_factory=dict, compare=False, hash=False)


class Workload(list):
    """A ``list[SimRequest]`` in arrival order, plus :attr:`info`."""

    def __init__(self, requests: Iterable[SimRequest] = (), info: WorkloadInfo | None = None) -> None:
        super().__init__(requests)
        self.info = info if info is not None else WorkloadInfo("custom")


# ------------------------------------------------------------------------------------ helpers

def _streams(seed: int) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    """(lengths, arrivals, content) generators: independent children of ``SeedSequence(seed)``."""
    a, b, c = np.random.SeedSequence(seed).spawn(3)
    return np.random.default_rng(a), np.random.default_rng(b), np.random.default_rng(c)


def _arrivals(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    if not rate > 0:
        raise ValueError(f"rate must be > 0 req/s (math.inf = all at t=0), got {rate}")
    if math.isinf(rate) or n == 0:
        return np.zeros(n)
    gaps = rng.exponential(1.0 / rate, size=n)
    return np.concatenate(([0.0], np.cumsum(gaps[:-1])))


def _check_common(num_requests: int, max_len: int) -> None:
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2, got {max_len}")


def _prompt_cap(max_len: int, output_max: int, minimum: int) -> int:
    cap = max_len - output_max
    if cap < minimum:
        raise ValueError(f"max_len {max_len} leaves {cap} prompt tokens after {output_max} output tokens; "
                         f"need at least {minimum}")
    return cap


def _hex(rng: np.random.Generator, n: int) -> list[str]:
    return [f"{v:016x}" for v in rng.integers(0, 2**63, size=n, dtype=np.int64)]


def _build(name: str, prompts, outputs, arrivals, seed, rate, max_len, params, *, prefix_ids=None,
           prefix_lens=None, images=None, **info_kw) -> Workload:
    reqs = [SimRequest(f"{name}-{i}", float(arrivals[i]), int(prompts[i]), int(outputs[i]),
                       None if prefix_ids is None else prefix_ids[i],
                       0 if prefix_lens is None else int(prefix_lens[i]),
                       () if images is None else images[i]) for i in range(len(prompts))]
    return Workload(reqs, WorkloadInfo(name, seed, rate, max_len, params=params, **info_kw))


def _lognormal_arxiv(rng: np.random.Generator, n: int, cap: int) -> np.ndarray:
    raw = rng.lognormal(math.log(ARXIV_MEDIAN), ARXIV_SIGMA, size=n)
    return np.clip(np.rint(raw), min(ARXIV_MIN, cap), cap).astype(np.int64)


# --------------------------------------------------------------------------------- generators

def mmlu_pro(num_requests: int = 1000, rate: float = math.inf, seed: int = 0, max_len: int = 131072,
             output_len: int = 20, mean_prompt_len: float = 300.0) -> Workload:
    """Short questions: lognormal(sigma 0.7) with mean ``mean_prompt_len`` (300), clipped to
    [16, min(3076, max_len - output_len)] — MMLU-pro tops out at 3076 tokens (paper §7).
    Output ``output_len`` (20, as in the Jamba run) for every request."""
    _check_common(num_requests, max_len)
    lens, arr, _ = _streams(seed)
    cap = min(MMLU_MAX, _prompt_cap(max_len, output_len, 16))
    sigma = 0.7
    raw = lens.lognormal(math.log(mean_prompt_len) - sigma**2 / 2, sigma, size=num_requests)
    prompts = np.clip(np.rint(raw), 16, cap)
    return _build("mmlu-pro", prompts, np.full(num_requests, output_len), _arrivals(arr, num_requests, rate),
                  seed, rate, max_len, dict(output_len=output_len, mean_prompt_len=mean_prompt_len))


def arxiv_qa(num_requests: int = 32, rate: float = math.inf, seed: int = 0, max_len: int = 131072,
             output_len: int = 150) -> Workload:
    """Whole arXiv articles: lognormal(median 94,400, sigma 0.6) clipped to
    [1024, max_len - output_len].  At max_len 131072 the mean is ~92.4k (paper: 92,408 for
    Ministral) with ~29% of prompts at the cap; at 1M it is ~113k.  Output 150."""
    _check_common(num_requests, max_len)
    lens, arr, _ = _streams(seed)
    prompts = _lognormal_arxiv(lens, num_requests, _prompt_cap(max_len, output_len, 1))
    return _build("arxiv-qa", prompts, np.full(num_requests, output_len), _arrivals(arr, num_requests, rate),
                  seed, rate, max_len, dict(output_len=output_len))


def mmmu_pro(num_requests: int = 200, rate: float = math.inf, seed: int = 0, max_len: int = 131072,
             output_len: int = 200) -> Workload:
    """One image per request at offset 1 (after BOS): ``1601 x tiles`` tokens with tiles in
    {1, 2, 3, 4} w.p. 0.01/0.01/0.08/0.90 (mean 6,196; paper 6,193), plus 1 + Poisson(42) text
    tokens (mean 43).  Every image is distinct.  Output 200.  Raises ``ValueError`` when a
    4-tile prompt cannot fit ``max_len``."""
    _check_common(num_requests, max_len)
    lens, arr, content = _streams(seed)
    text = 1 + lens.poisson(42, size=num_requests)
    tiles = 1 + lens.choice(4, size=num_requests, p=_TILE_PROBS)
    img = tiles * MLLAMA_TOKENS_PER_TILE
    prompts = text + img
    cap = _prompt_cap(max_len, output_len, 1)
    if num_requests and int(prompts.max()) > cap:
        raise ValueError(f"mmmu-pro prompts reach {int(prompts.max())} tokens; max_len {max_len} "
                         f"allows {cap} with output {output_len}")
    hashes = _hex(content, num_requests)
    images = [((1, int(img[i]), hashes[i]),) for i in range(num_requests)]
    return _build("mmmu-pro", prompts, np.full(num_requests, output_len), _arrivals(arr, num_requests, rate),
                  seed, rate, max_len, dict(output_len=output_len), images=images)


def ministral_static(num_requests: int = 200, rate: float = math.inf, seed: int = 0, max_len: int = 131072,
                     output_len: int = 150, length_range: tuple[int, int] = (16384, 114688)) -> Workload:
    """Fixed length distribution (paper Fig. 16, traces unpublished): prompts U(16384, 114688),
    mean 65,536, clipped to max_len - output_len.  Output 150."""
    _check_common(num_requests, max_len)
    lens, arr, _ = _streams(seed)
    lo, hi = length_range
    prompts = np.minimum(lens.integers(lo, hi, size=num_requests, endpoint=True),
                         _prompt_cap(max_len, output_len, 1))
    return _build("ministral-static", prompts, np.full(num_requests, output_len),
                  _arrivals(arr, num_requests, rate), seed, rate, max_len,
                  dict(output_len=output_len, length_range=length_range))


def ministral_dynamic(num_requests: int = 200, rate: float = math.inf, seed: int = 0, max_len: int = 131072,
                      output_len: int = 150, mean_range: tuple[int, int] = (16384, 114688)) -> Workload:
    """Mean length varying uniformly over time (paper Fig. 16): request ``i`` (arrival order)
    has mean ``m_i`` swept linearly from ``mean_range[0]`` to ``mean_range[1]`` and length
    U(7/8 m_i, 9/8 m_i), clipped to max_len - output_len (overall mean 65,536).  Output 150."""
    _check_common(num_requests, max_len)
    lens, arr, _ = _streams(seed)
    means = np.linspace(mean_range[0], mean_range[1], num_requests)
    raw = lens.uniform(7 / 8, 9 / 8, size=num_requests) * means
    prompts = np.clip(np.rint(raw), 1, _prompt_cap(max_len, output_len, 1))
    return _build("ministral-dynamic", prompts, np.full(num_requests, output_len),
                  _arrivals(arr, num_requests, rate), seed, rate, max_len,
                  dict(output_len=output_len, mean_range=mean_range))


def decode_batch_20(num_requests: int = 20, rate: float = math.inf, seed: int = 0,
                    max_len: int = 131072) -> Workload:
    """Paper Fig. 15: simultaneous requests (``rate`` inf), prompt U(55000, 110000), output
    U(50, 100) (integers, inclusive), prompts clipped to max_len - output."""
    _check_common(num_requests, max_len)
    lens, arr, _ = _streams(seed)
    outputs = lens.integers(50, 100, size=num_requests, endpoint=True)
    prompts = lens.integers(55_000, 110_000, size=num_requests, endpoint=True)
    prompts = np.minimum(prompts, max_len - outputs)
    if num_requests and int(prompts.min()) < 1:
        raise ValueError(f"max_len {max_len} is too small for outputs up to 100 tokens")
    return _build("decode-batch-20", prompts, outputs, _arrivals(arr, num_requests, rate),
                  seed, rate, max_len, {})


def spec_decode(num_requests: int = 100, rate: float = math.inf, seed: int = 0, max_len: int = 131072,
                base: str = "mmlu-pro", num_spec_tokens: int = 3, acceptance: float = 0.7,
                **base_kw) -> Workload:
    """The ``base`` workload's requests, marked for speculative decoding (paper §7): the info
    carries ``num_spec_tokens`` (3) and the per-token ``acceptance`` rate (0.7, as fixed for the
    dummy-weight pairs)."""
    if base == "spec-decode":
        raise ValueError("spec-decode cannot use itself as base")
    if num_spec_tokens < 1 or not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"need num_spec_tokens >= 1 and acceptance in [0, 1], got {num_spec_tokens}, {acceptance}")
    w = get_workload(base, num_requests=num_requests, rate=rate, seed=seed, max_len=max_len, **base_kw)
    params = dict(base=base, **w.info.params)
    return Workload(w, WorkloadInfo("spec-decode", seed, rate, max_len, num_spec_tokens, acceptance, params))


_GENERATORS: dict[str, Callable[..., Workload]] = {
    "mmlu-pro": mmlu_pro,
    "arxiv-qa": arxiv_qa,
    "mmmu-pro": mmmu_pro,
    "ministral-static": ministral_static,
    "ministral-dynamic": ministral_dynamic,
    "decode-batch-20": decode_batch_20,
    "spec-decode": spec_decode,
}
#: Generators in :mod:`jenga.sim.artifact_workloads` (imported on first use: it imports this module).
_ARTIFACT_NAMES = ("arxiv-multiq", "mmlu-pro-5shot")
WORKLOAD_NAMES: tuple[str, ...] = tuple(_GENERATORS) + _ARTIFACT_NAMES


def _generator(name: str) -> Callable[..., Workload]:
    if name in _ARTIFACT_NAMES:
        from jenga.sim.artifact_workloads import ARTIFACT_GENERATORS
        return ARTIFACT_GENERATORS[name]
    return _GENERATORS[name]


def get_workload(name: str, **kw) -> Workload:
    """Generate workload ``name`` with generator keyword arguments ``kw``.

    Raises ``UnknownWorkloadError`` listing :data:`WORKLOAD_NAMES`, or ``TypeError`` naming the
    generator's parameters when ``kw`` has one it does not take."""
    try:
        gen = _generator(name)
    except (KeyError, TypeError):
        raise UnknownWorkloadError(f"unknown workload {name!r}; choose one of {list(WORKLOAD_NAMES)}") from None
    sig = inspect.signature(gen)
    if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        bad = sorted(set(kw) - set(sig.parameters))
        if bad:
            raise TypeError(f"workload {name!r} does not take {bad}; parameters: {list(sig.parameters)}")
    return gen(**kw)
