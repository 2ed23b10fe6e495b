"""The cache-correctness oracle inside vLLM 0.32 (CPU, end to end): jenga's scheduler with prefix
caching on gives the tokens it gives with caching off.

The seeded trace of :mod:`engine_cache_oracle` (rounds over shared documents, later rounds continuing
earlier answers; documents of 48-112 tokens so that vLLM's 32-token blocks are hit; answers of 32-56
tokens) runs through two engines with ``scheduler_cls=JengaScheduler`` and the same tight budget (vLLM blocks: requests
preempt each other, cached pages are evicted), one with ``enable_prefix_caching`` and one
without.  Every request's greedy tokens must be equal, and the caching-on run must have prefix hit
tokens, preemptions and evicted pages (with the host tier: host hit tokens, promotions and
demotions; with images: requests whose prefix hit covered their picture; with speculative decoding:
draft tokens vLLM accepted).

The budget is tuned per family and feature: :data:`FAMILIES` gives the first budget tried, and while
the caching-on run has no preemption the budget shrinks by :data:`SHRINK` (at most :data:`TRIES`
runs; a budget vLLM or jenga refuses at start, below one request of ``max_model_len``, grows
back, and once one was taken the next try lies halfway between the refused budget and the taken one);
the caching-off run then takes the budget of the caching-on run's last taken run.

Features per family (:data:`FAMILIES`): ``plain``; ``salts`` (``cache_salt`` per request, three
tenants); ``lora`` (two random rank-8 adapters and the base model, one per request: a page shared
across adapters would change the tokens; on the MoE families stock vLLM 0.32's CPU build itself fails,
:data:`REFUSED`); ``spec`` (n-gram proposals, or a draft model on Llama;
on a Mamba hybrid jenga refuses it at engine start, by name: vLLM keeps a state block per draft token,
jenga's state pages one, :data:`REFUSED`); ``host`` (jenga's host tier
through ``kv_offloading_size``); ``images`` (the VLMs of ``test_vllm_multimodal.py`` and
``test_vllm_gemma3_images.py``: the trace's documents each hold one of three pictures, prompts are
the models' word-level text, answers restricted to words so that later rounds continue them).

LoRA leaves one adapter slot free (``max_loras`` one above the adapters): vLLM's CPU LoRA ops
(``vllm.lora.ops.torch_ops``, 0.32) index the stacked weights with a token's slot, and a base-model
token's slot is ``-1``, so in a batch that mixes adapters and the base model its tokens get the
last slot's adapter.  Caching changes which requests share a batch, so with every slot loaded
stock vLLM's own tokens differ between caching on and off (seed 0: 5 of 18 requests); the free
last slot stays zeros and the base model's tokens are exact.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path

from engine_cache_oracle import make_trace
from vllm_support import (
    allow_engines_after_numba,
    close,
    draft_dir,
    engine,
    lora_dir,
    model_dir,
    scheduler,
    spec_stats,
)

from jenga.errors import InsufficientMemoryError

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
#: decodes long enough to outgrow the headroom jenga's admission keeps (so requests preempt each other);
#: a third-round request (a document, 23 own tokens, three answers, two continuations) stays under 320
DOC_LEN, MAX_TOKENS = (48, 112), (32, 56)
IMAGE_DOC_LEN = (16, 48)  # a VLM's documents: the picture's tokens (up to 67) come on top
ADAPTERS = {"a": 1, "b": 2}  # LoRA name -> id and weight seed
TEXT = ("plain", "salts", "lora", "spec", "host")
STATE = ("plain", "salts", "lora", "host", "spec")
#: (family, feature) -> (who, what): a case with no reference to check, checked for that instead.
#: "jenga": jenga's engine refuses it at start with an error naming ``what`` (``jenga.vllm.specs.state_spec``:
#: vLLM keeps a state block per draft token, jenga's state pages one); "vLLM": stock vLLM 0.32's CPU
#: build itself (no jenga) fails at its first step with an error naming ``what`` (with LoRA on, a MoE
#: layer runs vLLM's Triton experts, and its CPU build has no Triton: ``triton.language`` has no
#: ``float32``, nor ``bfloat16`` for Qwen3-Next).  When such a case fails, the thing it records changed: run it as a case again.
REFUSED = {**{(f, "spec"): ("jenga", "speculative Mamba blocks") for f in ("falcon_h1", "qwen3_next")},
           **{(f, "lora"): ("vLLM", "triton.language") for f in ("gptoss", "llama4", "qwen3_next")}}
FP32 = dict(dtype="float32")

#: family -> (engine kwargs, first budget tried in vLLM blocks, features)
FAMILIES: dict[str, tuple[dict, int, tuple[str, ...]]] = {
    "llama": (FP32, 16, TEXT),
    "gemma3": (FP32, 96, TEXT),
    "gemma2": (FP32, 28, TEXT),
    "ministral": (FP32, 45, TEXT),
    "gptoss": (FP32, 40, TEXT),
    "llama4": (FP32, 50, TEXT),
    "falcon_h1": (FP32, 24, STATE),
    "qwen3_next": (dict(dtype="bfloat16", mamba_ssm_cache_dtype="bfloat16"), 36, STATE),
    "idefics3": (dict(FP32, limit_mm_per_prompt={"image": 1}), 45, ("images",)),
    "gemma3_vision": (dict(FP32, limit_mm_per_prompt={"image": 1}), 45, ("images",)),
}
FEATURES = ("plain", "salts", "lora", "spec", "host", "images")
#: family -> the image marker of its prompts, picture size (pixels), tokens per picture, image token id
VLMS = {"idefics3": ("<image>", 256, 64, 3), "gemma3_vision": ("<start_of_image>", 32, 16, 511)}
TRIES, SHRINK = 5, 0.8
WORDS = range(11, 508)  # token ids that are words ("w11" ..) in both VLMs' tokenizers: what answers may be


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
    blocks: int = 0  # the budget both runs had
    refused: str = ""  # a case of :data:`REFUSED`: the error jenga or stock vLLM gave

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


@contextlib.contextmanager
def _model(family: str, root: Path):
    """The family's model folder; the Gemma-3 VLM with its torchvision-free image processor in place
    (``test_vllm_gemma3_images.py``) for as long as its engines run."""
    if family == "idefics3":
        from test_vllm_multimodal import vision_dir

        yield vision_dir(root)
    elif family == "gemma3_vision":
        import test_vllm_gemma3_images as g

        g.gemma3_image_shim.install()
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (g.SITE, old) if p)  # vLLM's inspection subprocess
        try:
            yield g.gemma3_dir(root)
        finally:
            if old is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = old
    else:
        yield model_dir(family, root)


def _picture(img, size: int):
    """A trace's image (a seeded 3x32x32 tensor) as an RGB picture of ``size`` pixels: the same
    tensor, the same picture (vLLM hashes pictures by content)."""
    import torch
    from PIL import Image

    px = ((img.clamp(-2, 2) + 2) * 63.75).to(torch.uint8).permute(1, 2, 0).numpy()
    return Image.fromarray(px).resize((size, size), Image.NEAREST)


def _image_prompt(family: str, ids: list[int], images: list) -> dict:
    """A trace request's tokens as the VLM's word-level text: the engine's image block (begin, image
    tokens, end) becomes the model's marker, a token ``t`` the word ``w{t + 8}``."""
    from jenga.engine.models.weights import TINY_BOI, TINY_EOI, TINY_IMAGE

    marker, size, _, _ = VLMS[family]
    words = [marker if t == TINY_BOI else f"w{t + 8}" for t in ids if t not in (TINY_EOI, TINY_IMAGE)]
    return {"prompt": " ".join(words), "multi_modal_data": {"image": _picture(images[0], size)}} if images else \
        {"prompt": " ".join(words)}


def _accepted(llm, feature: str) -> int:
    """Draft tokens vLLM has accepted in this process (its counters sum over the process's engines;
    vLLM's stats are on for ``spec`` only, 0 otherwise)."""
    return spec_stats(llm).get("accepted_tokens", 0) if feature == "spec" else 0


def run(family: str, trace, root: Path, *, caching: bool, feature: str, seed: int,
        blocks: int | None = None, jenga: bool = True) -> tuple[list, dict]:
    """``trace`` round by round through one jenga engine of ``blocks`` vLLM blocks (default: the
    family's first budget); the tokens and the scheduler's counts (``jenga=False``: stock vLLM's
    scheduler, the tokens only)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    kw, first, _ = FAMILIES[family]
    blocks = blocks or first
    images = feature == "images"
    with _model(family, root) as path:
        llm = engine(path, jenga=jenga, num_blocks=blocks, max_model_len=320,
                     enable_prefix_caching=caching, **kw, **_feature_kw(family, feature, root, path, blocks))
        adapters = _adapters(path, root) if feature == "lora" else None
        accepted_before = _accepted(llm, feature)
        pick = random.Random(f"lora:{seed}")
        tokens, prev, image_hits = [], [], 0
        try:
            for rnd in trace.rounds:
                prompts, params, loras = [], [], []
                for q in rnd:
                    if images:  # a continuation: its parent's text and answer, then its own words
                        p = _image_prompt(family, q.ids, q.images)
                        if q.parent is not None:
                            p["prompt"] = prev[q.parent] + " " + p["prompt"]
                    else:
                        p = TokensPrompt(prompt_token_ids=q.ids if q.parent is None else prev[q.parent] + q.ids)
                    if q.salt is not None:
                        p["cache_salt"] = q.salt
                    prompts.append(p)
                    params.append(SamplingParams(temperature=0, max_tokens=q.max_tokens, ignore_eos=True,
                                                 allowed_token_ids=list(WORDS) if images else None))
                    loras.append(pick.choice(adapters) if adapters else None)
                outs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras if adapters else None)
                got = [list(o.outputs[0].token_ids) for o in outs]
                tokens += got
                if images:  # requests whose prefix hit covered their picture's tokens
                    image = VLMS[family][3]
                    image_hits += sum(image in o.prompt_token_ids and o.num_cached_tokens >
                                      len(o.prompt_token_ids) - 1 - o.prompt_token_ids[::-1].index(image) for o in outs)
                if images:
                    prev = [p["prompt"] + "".join(f" w{t}" for t in g) for p, g in zip(prompts, got, strict=True)]
                else:
                    prev = [p["prompt_token_ids"] + g for p, g in zip(prompts, got, strict=True)]
            if not jenga:
                return tokens, {}
            sched = scheduler(llm)
            st = sched.jenga.stats()
            counts = dict(hits=st.prefix_hit_tokens, preemptions=sched.num_preemptions, evicted=st.evicted_pages,
                          host_hits=st.host_hit_tokens, promotions=st.promotions, demotions=st.demotions,
                          image_hits=image_hits, accepted=_accepted(llm, feature) - accepted_before)
            mgr = sched.jenga
            assert mgr.used_bytes == 0 and not mgr.requests, "pages held after every request finished"
            mgr.check_integrity()
        finally:
            close(llm)
    return tokens, counts


def oracle_trace(family: str, feature: str, seed: int, **trace_kw):
    """The seeded trace of one case (``trace_kw``: :func:`engine_cache_oracle.make_trace`'s sizes)."""
    doc_len = IMAGE_DOC_LEN if feature == "images" else DOC_LEN
    return make_trace(family, seed, feature if feature in ("salts", "images") else "plain",
                      **{"doc_len": doc_len, "max_tokens": MAX_TOKENS, **trace_kw})


def _refusal(family: str, feature: str, seed: int, root: Path, trace) -> VllmResult:
    """A case of :data:`REFUSED`: jenga's engine refuses it at start, or stock vLLM fails it, naming why."""
    from jenga.vllm.specs import UnsupportedInVllm

    who, what = REFUSED[family, feature]
    expected = UnsupportedInVllm if who == "jenga" else Exception  # vLLM: whatever its kernels raise
    try:
        run(family, trace, root, caching=True, feature=feature, seed=seed, jenga=who == "jenga")
    except expected as e:
        ok = what in str(e)
        return VllmResult(family, feature, seed, 0, 0, {}, {}, [] if ok else [f"{who} failed otherwise: {e}"],
                          refused=f"{type(e).__name__}: {e}")
    return VllmResult(family, feature, seed, 0, 0, {}, {}, [f"ran: {who} was to fail it ({what})"])


def compare(family: str, feature: str, seed: int, root: Path, **trace_kw) -> VllmResult:
    """Caching on vs off over one seeded trace (``trace_kw``: :func:`engine_cache_oracle.make_trace`'s sizes);
    a case of :data:`REFUSED`: its refusal or failure (:func:`_refusal`)."""
    trace = oracle_trace(family, feature, seed, **trace_kw)
    if (family, feature) in REFUSED:
        return _refusal(family, feature, seed, root, trace)
    blocks, accepted, refused = FAMILIES[family][1], None, 0
    for _ in range(TRIES):
        try:
            on, c_on = run(family, trace, root, caching=True, feature=feature, seed=seed, blocks=blocks)
        except (ValueError, InsufficientMemoryError) as e:  # a budget below one request of max_model_len
            if "max seq len" not in str(e) and "max_model_len" not in str(e):
                raise
            refused = blocks
            if accepted is None:  # none taken yet: grow back
                blocks = math.ceil(blocks / SHRINK)
                continue
        else:
            accepted = blocks  # every budget tried after the first taken one lies below it
            if c_on["preemptions"]:
                break
        # shrink the last budget taken, and never to a refused one: halfway between the two
        blocks = int(accepted * SHRINK) if int(accepted * SHRINK) > refused else (accepted + refused) // 2
        if blocks <= refused:
            break
    if accepted is None:
        raise ValueError(f"vLLM refused every budget up to {blocks} blocks")
    blocks = accepted  # on and c_on are this budget's run: the last one vLLM took
    off, c_off = run(family, trace, root, caching=False, feature=feature, seed=seed, blocks=blocks)
    problems = [f"request {i}: tokens {a} with caching, {b} without"
                for i, (a, b) in enumerate(zip(on, off, strict=True)) if a != b]
    need = {k: c_on[k] for k in ("hits", "preemptions", "evicted")}
    if feature == "host":
        need.update(host_hits=c_on["host_hits"], promotions=c_on["promotions"], demotions=c_on["demotions"])
    if feature == "images":
        need["image_hits"] = c_on["image_hits"]
    if feature == "spec":  # draft tokens vLLM accepted: the proposer ran and its tokens were kept
        need["accepted"] = c_on["accepted"]
    problems += [f"vacuous: {k} = 0 with caching on" for k, v in need.items() if not v]
    return VllmResult(family, feature, seed, len(on) - sum(a != b for a, b in zip(on, off, strict=True)),
                      trace.num_requests, c_on, c_off, problems, blocks)


def check(family: str, feature: str, seed: int, root: Path, **trace_kw) -> VllmResult:
    """:func:`compare`, asserting no problem."""
    res = compare(family, feature, seed, root, **trace_kw)
    assert res.ok, f"vLLM {family} {feature} seed {seed}: " + "; ".join(res.problems[:6])
    return res
