"""Admission when the scheduler orders admissions by cached prefix: protected pages hold no
admission back.

:class:`~jenga.core.manager.admission.Admission` keeps the pages the evictor protects (reused at
least twice, ``eviction="reuse"``) out of an admission's reach while other requests run: in first
come, first served order, a request that misses would otherwise evict the hot prefix the requests
queued behind it were about to hit.  A scheduler that admits the waiting requests whose prefix is
cached first (``jenga.vllm.admission.HitsFirst``, vLLM 0.34's cache-aware admission) already
serves those hits before the miss; holding the miss back then only keeps pages for requests that
have not arrived, at the cost of the batch (measured in ``benchmarks/vs_vllm_sched.py``: on
Llama-3.1-8B and Ministral-8B articles at a quarter of the H100 budget, the same hits at 8.0 vs
12.7 requests per step).  :class:`OrderedAdmission` lets such an admission evict in the
evictor's order (one-off pages first, then reused ones most recently released first), as a
lone request may.  It is no default: when the reuse comes from requests not yet arrived (rounds
of questions, each after the previous round is done, over more articles than the pool holds) the
hold is what keeps a resident subset hitting (``tests/test_vllm_admission.py``); telling the two
apart needs a prediction of each prefix's next use.

``ADMISSION_RULES`` names the rules for ``KVCacheManager(admission=...)``.
"""

from __future__ import annotations

from jenga.core.manager.admission import Admission


class OrderedAdmission(Admission):
    """``Admission`` without the protected-page hold on admissions (module doc)."""

    def protected(self, allocated: int, groups: list[int] | None = None) -> None:
        return None


#: ``KVCacheManager(admission=...)``: "protect" (protected pages hold admissions back while others
#: run; for first come, first served admission) or "ordered" (the scheduler orders admissions by
#: cached prefix; module doc)
ADMISSION_RULES: dict[str, type[Admission]] = {"protect": Admission, "ordered": OrderedAdmission}
