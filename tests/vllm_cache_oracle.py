"""The cache-correctness oracle inside vLLM 0.32 (CPU, end to end): jenga's scheduler with prefix
caching on gives the tokens it gives with caching off.

The seeded trace of :mod:`engine_cache_oracle` (rounds over shared documents, later rounds continuing
earlier answers; documents of 64-128 tokens so that vLLM's 32-token blocks are hit) runs through
two engines with ``scheduler_cls=JengaScheduler`` and the same tight budget (vLLM blocks: requests
preempt each other, cached pages are evicted), one with ``enable_prefix_caching`` and one
without.  Every request's greedy tokens must be equal, and the caching-on run must have prefix hit
tokens, preemptions and evicted pages (with the host tier: host hit tokens).

Features per family (:data:`FAMILIES`): ``plain``; ``salts`` (``cache_salt`` per request, three
tenants); ``lora`` (two random rank-8 adapters and the base model, one per request: a page shared
across adapters would change the tokens); ``spec`` (n-gram proposals, or a draft model where
given); ``host`` (jenga's host tier through ``kv_offloading_size``).

LoRA leaves one adapter slot free (``max_loras`` one above the adapters): vLLM's CPU LoRA ops
(``vllm.lora.ops.torch_ops``, 0.32) index the stacked weights with a token's slot, and a base-model
token's slot is ``-1``, so in a batch that mixes adapters and the base model its tokens get the
last slot's adapter.  Caching changes which requests share a batch, so with every slot loaded
stock vLLM's own tokens differ between caching on and off (seed 0: 5 of 18 requests); the free
last slot stays zeros and the base model's tokens are exact.  Images run in the engine's
oracle (``tests/engine_cache_oracle.py``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from engine_cache_oracle import make_trace
from vllm_support import allow_engines_after_numba, close, draft_dir, engine, lora_dir, model_dir, scheduler

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
DOC_LEN, MAX_TOKENS = (64, 128), (16, 32)
ADAPTERS = {"a": 1, "b": 2}  # LoRA name -> id and weight seed

#: family -> (engine kwargs, tight budget in vLLM blocks, features)
FAMILIES: dict[str, tuple[dict, int, tuple[str, ...]]] = {
    "llama": (dict(dtype="float32"), 16, ("plain", "salts", "lora", "spec", "host")),
    "gemma3": (dict(dtype="float32"), 96, ("plain", "salts", "lora", "spec", "host")),
    "gemma2": (dict(dtype="float32"), 40, ("plain", "salts")),
    "ministral": (dict(dtype="float32"), 40, ("plain", "salts")),
    "gptoss": (dict(dtype="float32"), 40, ("plain", "salts")),
    "llama4": (dict(dtype="float32"), 40, ("plain", "salts")),
    "falcon_h1": (dict(dtype="float32"), 24, ("plain", "salts")),
    "qwen3_next": (dict(dtype="bfloat16", mamba_ssm_cache_dtype="bfloat16"), 36, ("plain", "salts", "host")),
}
FEATURES = ("plain", "salts", "lora", "spec", "host")


@dataclass
class VllmResult:
    family: str
    feature: str
    seed: int
    equal: int
    total: int
    on: dict
    off: dict
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def _feature_kw(family: str, feature: str, root: Path, path: str, blocks: int) -> dict:
    if feature == "lora":  # a spare slot, never loaded (module doc): base-model tokens read it, all zeros
        return dict(enable_lora=True, max_loras=len(ADAPTERS) + 1, max_lora_rank=8)
    if feature == "spec":
        allow_engines_after_numba()
        spec = {"model": draft_dir(path, root), "num_speculative_tokens": 3} if family == "llama" else NGRAM
        return dict(speculative_config=spec, disable_log_stats=False)
    if feature == "host":  # a host tier about four times the device budget
        return dict(kv_offloading_size=0.008 if family == "gemma3" else 0.016)
    return {}


def _adapters(path: str, root: Path) -> list:
    from vllm.lora.request import LoRARequest

    return [None] + [LoRARequest(name, i, lora_dir(path, root, name, seed=i)) for name, i in ADAPTERS.items()]


def run(family: str, trace, root: Path, *, caching: bool, feature: str, seed: int) -> tuple[list, dict]:
    """``trace`` round by round through one jenga engine; the tokens and the scheduler's counts."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    kw, blocks, _ = FAMILIES[family]
    path = model_dir(family, root)
    llm = engine(path, jenga=True, num_blocks=blocks, max_model_len=320, enable_prefix_caching=caching,
                 **kw, **_feature_kw(family, feature, root, path, blocks))
    adapters = _adapters(path, root) if feature == "lora" else None
    pick = random.Random(f"lora:{seed}")
    tokens, prev = [], []
    try:
        for rnd in trace.rounds:
            prompts, params, loras = [], [], []
            for q in rnd:
                ids = q.ids if q.parent is None else prev[q.parent] + q.ids
                p = TokensPrompt(prompt_token_ids=ids)
                if q.salt is not None:
                    p["cache_salt"] = q.salt
                prompts.append(p)
                params.append(SamplingParams(temperature=0, max_tokens=q.max_tokens, ignore_eos=True))
                loras.append(pick.choice(adapters) if adapters else None)
            outs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras if adapters else None)
            got = [list(o.outputs[0].token_ids) for o in outs]
            tokens += got
            prev = [p["prompt_token_ids"] + g for p, g in zip(prompts, got, strict=True)]
        sched = scheduler(llm)
        st = sched.jenga.stats()
        counts = dict(hits=st.prefix_hit_tokens, preemptions=sched.num_preemptions, evicted=st.evicted_pages,
                      host_hits=st.host_hit_tokens, promotions=st.promotions, demotions=st.demotions)
        mgr = sched.jenga
        assert mgr.used_bytes == 0 and not mgr.requests, "pages held after every request finished"
        mgr.check_integrity()
    finally:
        close(llm)
    return tokens, counts


def compare(family: str, feature: str, seed: int, root: Path, **trace_kw) -> VllmResult:
    """Caching on vs off over one seeded trace (``trace_kw``: :func:`engine_cache_oracle.make_trace`'s sizes)."""
    trace = make_trace(family, seed, feature if feature == "salts" else "plain",
                       **{"doc_len": DOC_LEN, "max_tokens": MAX_TOKENS, **trace_kw})
    on, c_on = run(family, trace, root, caching=True, feature=feature, seed=seed)
    off, c_off = run(family, trace, root, caching=False, feature=feature, seed=seed)
    problems = [f"request {i}: tokens {a} with caching, {b} without"
                for i, (a, b) in enumerate(zip(on, off, strict=True)) if a != b]
    need = {k: c_on[k] for k in ("hits", "preemptions", "evicted")}
    if feature == "host":
        need.update(host_hits=c_on["host_hits"], promotions=c_on["promotions"], demotions=c_on["demotions"])
    problems += [f"vacuous: {k} = 0 with caching on" for k, v in need.items() if not v]
    return VllmResult(family, feature, seed, len(on) - sum(a != b for a, b in zip(on, off, strict=True)),
                      trace.num_requests, c_on, c_off, problems)


def check(family: str, feature: str, seed: int, root: Path, **trace_kw) -> VllmResult:
    """:func:`compare`, asserting no problem."""
    res = compare(family, feature, seed, root, **trace_kw)
    assert res.ok, f"vLLM {family} {feature} seed {seed}: " + "; ".join(res.problems[:6])
    return res
