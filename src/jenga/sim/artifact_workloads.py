"""The paper artifact's figure-14 workloads (heheda12345/Jenga-SOSP25-AE, ``benchmark_serving.py``).

Synthetic (nothing is downloaded) but built the way the artifact builds its requests:

``arxiv-multiq``
    ``liyucheng/arxiv-march-2023`` as the artifact uses it: a *document* is a fixed group of
    arXiv papers concatenated (the artifact's ``get_ministral_article_ids`` groups; their sizes
    are :data:`ARXIV_GROUP_SIZES`) and, with a prompt-length cap (``--hf-max-len``,
    ``max_prompt_len`` here), only the longest run of whole papers whose prompt + output fits
    the cap.  Each document gets ``questions_per_article`` questions (4 in figure 14), all
    sharing the document as prefix.  Order ``shuffled`` builds the list document-major and
    shuffles it with Python's ``random.Random(seed)`` as the artifact's ``random.shuffle``
    after ``random.seed(--seed)`` does; ``interleaved`` is round robin, ``grouped`` unshuffled.
    Paper lengths: the document's total length is drawn like ``arxiv-qa`` (lognormal, median
    94,400 — paper: Ministral mean input 92,408 uncapped) and split over its papers with
    uniform Dirichlet weights (individual paper lengths are not published).
``mmlu-pro-5shot``
    ``meta-llama/Llama-3.1-405B-evals`` MMLU-pro details: 5-shot chain-of-thought prompts,
    so every question of a subject shares that subject's 5-shot prefix (MMLU-Pro, Wang et al.
    2024: 14 subjects, few-shot examples per subject from the validation split).  Per-subject
    sample counts and prompt lengths (mean / min / max characters) are evalscope's MMLU-Pro
    statistics (evalscope.readthedocs.io, benchmarks/mmlu_pro, v1.6.0); characters -> tokens
    at 12,100 / 3,076 chars per token (the longest prompt, paper §7: "MMLU-pro tops out at
    3076 tokens").  A subject's prefix is its shortest prompt minus :data:`MMLU_MIN_QUESTION`
    tokens (assumed); a question adds that plus an exponential tail with the subject's mean,
    capped at its longest prompt.  Mean prompt ~1,270 tokens.  Output ``output_len`` (20 for
    Jamba; the Llama 3.1 run used the reference completions' lengths, not published).
"""

from __future__ import annotations

import math
import random

import numpy as np

from jenga.sim.workloads import (
    Workload,
    _arrivals,
    _build,
    _check_common,
    _lognormal_arxiv,
    _prompt_cap,
    _streams,
)

#: Papers per document in the artifact's ``get_ministral_article_ids`` (in order; cycled).
ARXIV_GROUP_SIZES = (9, 5, 7, 5, 4, 11, 10, 18, 9, 11, 5, 8, 8, 3, 2, 3, 5, 13, 10, 9, 10, 10, 11, 10, 10,
                     11, 11, 11, 3, 5, 11, 8, 10, 11, 12, 8, 9, 6, 10, 3, 5, 5, 5, 6, 9, 5, 6, 4, 12, 13,
                     6, 6, 12, 8, 12, 7, 8, 7, 10, 8, 10)
ORDERS = ("interleaved", "grouped", "shuffled")


def arxiv_multiq(num_requests: int | None = None, rate: float = math.inf, seed: int = 0,
                 max_len: int = 131072, num_articles: int = 8, questions_per_article: int = 4,
                 output_len: int = 150, order: str = "interleaved", max_prompt_len: int | None = None) -> Workload:
    """See the module docstring.  ``num_requests`` defaults to ``num_articles x
    questions_per_article``; request ``i`` of the interleaved order asks about document
    ``i % num_articles``.  Each question adds 20 + Poisson(10) unique tokens."""
    n = num_articles * questions_per_article if num_requests is None else num_requests
    _check_common(n, max_len)
    if num_articles < 1 or questions_per_article < 1:
        raise ValueError(f"num_articles and questions_per_article must be >= 1, got {num_articles}, "
                         f"{questions_per_article}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if max_prompt_len is not None and max_prompt_len <= output_len:
        raise ValueError(f"max_prompt_len {max_prompt_len} leaves no prompt room after {output_len} output tokens")
    lens, arr, _ = _streams(seed)
    q_lens = 20 + lens.poisson(10, size=n)
    q_cap = int(q_lens.max()) if n else 0
    totals = _lognormal_arxiv(lens, num_articles, _prompt_cap(max_len, output_len + q_cap, 1))
    cap = math.inf if max_prompt_len is None else max_prompt_len - output_len - q_cap
    docs = np.zeros(num_articles, np.int64)
    for a in range(num_articles):
        k = ARXIV_GROUP_SIZES[a % len(ARXIV_GROUP_SIZES)]
        run = np.rint(np.cumsum(lens.dirichlet(np.ones(k))) * totals[a])  # document length after each paper
        docs[a] = int(run[run <= cap][-1]) if (run <= cap).any() else 0  # artifact: whole papers only
    if order == "interleaved":
        which = list(np.arange(n) % num_articles)
    else:
        which = sorted(np.arange(n) % num_articles, key=int)
        if order == "shuffled":
            random.Random(seed).shuffle(which)
    which = np.asarray(which, np.int64)
    prefix = docs[which]
    return _build("arxiv-multiq", prefix + q_lens, np.full(n, output_len), _arrivals(arr, n, rate), seed, rate,
                  max_len, dict(num_articles=num_articles, questions_per_article=questions_per_article,
                                output_len=output_len, order=order, max_prompt_len=max_prompt_len),
                  prefix_ids=[f"article-{a}" if docs[a] else None for a in which], prefix_lens=prefix)


#: evalscope MMLU-Pro per-subject statistics: (samples, mean, min, max prompt characters).
MMLU_SUBJECTS = ((410, 5184.05, 4696, 7303), (1351, 4853.54, 4574, 7519), (1132, 4567.2, 4182, 5975),
                 (969, 3595.66, 3048, 5775), (1101, 7001.35, 5581, 9200), (717, 5881.08, 5179, 7850),
                 (818, 4624.44, 4134, 9310), (1299, 4389.59, 4004, 6511), (789, 4646.01, 4316, 6915),
                 (499, 3760.1, 3360, 5289), (844, 4680.21, 4118, 6907), (924, 3730.86, 3316, 6108),
                 (798, 5274.19, 4656, 6942), (381, 9919.94, 8711, 12100))
MMLU_CHARS_PER_TOKEN = 12100 / 3076
#: Tokens of the shortest question + options + answer cue of a subject (assumed, not published).
MMLU_MIN_QUESTION = 48


def mmlu_pro_5shot(num_requests: int = 1000, rate: float = math.inf, seed: int = 0, max_len: int = 131072,
                   output_len: int = 20) -> Workload:
    """See the module docstring: subject ``s`` w.p. its sample share; shared prefix
    ``mmlu-s``; prompts clipped to ``max_len - output_len``."""
    _check_common(num_requests, max_len)
    lens, arr, _ = _streams(seed)
    st = np.array(MMLU_SUBJECTS, float)
    tok = st[:, 1:] / MMLU_CHARS_PER_TOKEN  # mean, min, max in tokens
    subj = lens.choice(len(st), size=num_requests, p=st[:, 0] / st[:, 0].sum())
    prefix = np.rint(tok[:, 1] - MMLU_MIN_QUESTION).astype(np.int64)
    tail = lens.exponential(1.0, size=num_requests) * (tok[subj, 0] - tok[subj, 1])
    prompts = np.minimum(np.rint(tok[subj, 1] + tail), np.rint(tok[subj, 2]))
    prompts = np.minimum(prompts, _prompt_cap(max_len, output_len, 16)).astype(np.int64)
    plen = np.minimum(prefix[subj], prompts - 1)
    return _build("mmlu-pro-5shot", prompts, np.full(num_requests, output_len),
                  _arrivals(arr, num_requests, rate), seed, rate, max_len, dict(output_len=output_len),
                  prefix_ids=[f"mmlu-{s}" for s in subj], prefix_lens=plen)


def reusable_prefix_share(w: Workload, align: int = 1) -> float:
    """The share of ``w``'s prompt tokens a prefix cache could serve, requests taken in order:
    each request after the first of its shared prefix reuses that prefix (its last prompt token
    always recomputed), cut down to a multiple of ``align`` tokens (a cache that keeps states only
    at such positions).  An upper bound: nothing is ever evicted."""
    seen, reused, total = set(), 0, 0
    for r in w:
        total += r.prompt_len
        if r.prefix_id is not None and r.prefix_id in seen:
            reused += min(r.prefix_len, r.prompt_len - 1) // align * align
        seen.add(r.prefix_id)
    return reused / total if total else 0.0


ARTIFACT_GENERATORS = {"arxiv-multiq": arxiv_multiq, "mmlu-pro-5shot": mmlu_pro_5shot}
