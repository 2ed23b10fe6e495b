"""Helpers for the manager tests: tiny hand-made specs, manager factories, state snapshots."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import os

from jenga.core.manager.manager import KVCacheManager
from jenga.core.pagesize import with_base_page
from jenga.core.specs import (
    ChunkedLocalSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    LayerGroup,
    MambaSpec,
    ModelSpec,
    SlidingWindowSpec,
    VisionEmbeddingSpec,
)

#: ``--dist loadgroup`` under pytest 9 (see the module)
pytest_plugins = ("xdist_groups",)

#: The vLLM tests are left out only when vLLM is not installed (no ``jenga[vllm]`` extra).  A vLLM
#: that is installed but fails to import (a broken dependency) fails them: nothing skips them then.
VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
VLLM_MODULES = "test_vllm_*.py"
if not VLLM_INSTALLED:
    collect_ignore_glob = [VLLM_MODULES]


def pytest_report_header(config):
    if not VLLM_INSTALLED:
        return f"vLLM is not installed: {VLLM_MODULES} not collected (install the jenga[vllm] extra)"
    return None

# vLLM's CUDA wheels (the Makefile's 0.33 / 0.34 venvs) find no platform without a GPU; their
# scheduler side runs on vLLM's CPU platform (set before any test module imports vLLM)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

# 2 * num_kv_heads * head_dim * bf16 = 2 * 1 * 32 * 2 = 128 bytes per token per layer (the paper's toy)
TOY_HEADS, TOY_HEAD_DIM = 1, 32
TOY_TOKEN_BYTES = 128


def full(**kw) -> FullAttentionSpec:
    return FullAttentionSpec("toy", num_kv_heads=TOY_HEADS, head_dim=TOY_HEAD_DIM, **kw)


def sliding(window: int, **kw) -> SlidingWindowSpec:
    return SlidingWindowSpec("toy", num_kv_heads=TOY_HEADS, head_dim=TOY_HEAD_DIM, window=window, **kw)


def chunked(chunk: int, **kw) -> ChunkedLocalSpec:
    return ChunkedLocalSpec("toy", num_kv_heads=TOY_HEADS, head_dim=TOY_HEAD_DIM, chunk=chunk, **kw)


def cross(**kw) -> CrossAttentionSpec:
    return CrossAttentionSpec("toy", num_kv_heads=TOY_HEADS, head_dim=TOY_HEAD_DIM, **kw)


def vision(hidden: int = 64) -> VisionEmbeddingSpec:
    # hidden * bf16 bytes per image token
    return VisionEmbeddingSpec("toy", hidden_size=hidden)


def mamba(every: int, state_elems: int = 64) -> MambaSpec:
    # one bf16 state tensor: 2 * state_elems bytes per layer
    return MambaSpec("toy", shapes=((state_elems,),), dtypes=("bf16",), checkpoint_interval=every)


def group(name: str, spec, n_layers: int, first_layer: int = 0) -> LayerGroup:
    """``n_layers`` layers of ``spec``; 1 token per page (the manager resets it to its base page)."""
    return LayerGroup(name, spec, tuple(range(first_layer, first_layer + n_layers)), tokens_per_page=1)


def model(*groups: LayerGroup, max_len: int = 4096, name: str = "toy") -> ModelSpec:
    return ModelSpec(name, tuple(groups), max_model_len=max_len, num_layers=sum(g.num_layers for g in groups))


def make_manager(spec: ModelSpec, num_large: int, *, tokens_per_page: int = 1, caching: bool = True,
                 window_slack: int = 0, out_of_window_age: int = 0, eviction: str = "lru",
                 eviction_options=None) -> KVCacheManager:
    """A manager with exactly ``num_large`` large pages (the budget keeps one slack page);
    no window slack, no extra age for out-of-window pages and LRU eviction by default, so
    pages follow the paper's text exactly."""
    budget = (num_large + 1) * with_base_page(spec, tokens_per_page).large_page_bytes
    mgr = KVCacheManager(spec, budget, tokens_per_page=tokens_per_page, enable_prefix_caching=caching,
                         fit_pages=False, window_slack=window_slack, out_of_window_age=out_of_window_age,
                         eviction=eviction, eviction_options=eviction_options)
    assert mgr.alloc.num_large == num_large
    return mgr


def toy_model(max_len: int = 4096) -> ModelSpec:
    """The paper's §4.1 toy: 128 B per token per layer, 1 token per page.

    Group 0 ``self`` (3 full-attention layers, 384 B pages, k = 2), group 1 ``cross``
    (2 cross-attention layers, 256 B pages, k = 3); large page 768 B.
    """
    return model(group("self", full(), 3), group("cross", cross(), 2, first_layer=3), max_len=max_len)


def two_full_model(max_len: int = 4096) -> ModelSpec:
    """Two full-attention groups with the toy's sizes: ``a`` 2 layers (k = 3), ``b`` 3 layers (k = 2)."""
    return model(group("a", full(), 2), group("b", full(), 3, first_layer=2), max_len=max_len)


def page_ids(mgr: KVCacheManager, rid, g: int) -> list:
    """A copy of request ``rid``'s token table of group ``g``."""
    return list(mgr.requests[rid].groups[g].pages)


def run(mgr: KVCacheManager, rid, n: int, sampled=(), *, lookahead: int = 0):
    """allocate(n) then append_tokens(sampled); returns the tables (asserts success)."""
    t = mgr.allocate(rid, n, num_lookahead=lookahead)
    assert t is not None, f"allocate({rid!r}, {n}) failed"
    mgr.append_tokens(rid, list(sampled))
    mgr.check_integrity()
    return t


def serve(mgr: KVCacheManager, rid, prompt, outputs=(), *, images=(), salt=None, free: bool = True) -> int:
    """Add, look up, prefill the prompt, decode ``outputs`` one token at a time, free.

    Returns the lookup hit.  The first output is sampled by the prefill step; every
    further output needs one decode step (so ``len(outputs) - 1`` decode steps).
    """
    mgr.add_request(rid, prompt, images=images, cache_salt=salt)
    hit = mgr.lookup(rid)
    outs = list(outputs)
    run(mgr, rid, len(prompt) - hit, outs[:1])
    for tok in outs[1:]:
        run(mgr, rid, 1, [tok])
    if free:
        mgr.free(rid)
        mgr.check_integrity()
    return hit


def cached_keys(mgr: KVCacheManager, g: int) -> dict[int, tuple[int, int]]:
    return dict(mgr.evictor.keys[g])


def evict_page(mgr: KVCacheManager, g: int, page: int) -> None:
    """Evict one specific CACHED page now (the evictor's out-of-order eviction)."""
    assert page in mgr.evictor.keys[g], f"page {g}:{page} is not cached"
    mgr.alloc.evict_many(g, [page])


def snapshot(mgr: KVCacheManager) -> dict:
    """Everything observable about the manager's state (not heap internals nor the clock)."""
    a = mgr.alloc
    reqs = {}
    for rid, r in mgr.requests.items():
        reqs[rid] = dict(
            tokens=list(r.tokens), computed=r.num_computed, scheduled=r.num_scheduled,
            lookahead=r.num_lookahead, hit=r.hit, hit_holds=sorted(r.hit_holds, key=repr),
            # block hashes are a lazily filled cache of (tokens, salt, images): compare those
            salt=r.salt_root, images=r.images,
            # each kind's record has its own fields (``Policy.state_type``): all of them but the table
            groups=[{f.name: copy.deepcopy(getattr(gs, f.name)) for f in dataclasses.fields(gs) if f.name != "table"}
                    for gs in r.groups],
            tables=None if r.tables is None else (r.tables.num_computed, r.tables.num_new, r.tables.num_lookahead),
        )
    return dict(
        stats=mgr.stats().as_dict(),
        state=[bytes(s) for s in a.state],
        group_of=list(a.group_of), tag_of=list(a.tag_of), n_used=list(a.n_used), n_cached=list(a.n_cached),
        in_e=bytes(a.in_e), free_small=list(a.free_small),
        cached_small=list(a.cached_small), hidden_free=list(a.hidden_free), used_small=list(a.used_small),
        **a.snapshot(),  # the free pool and the free-slot structures, as plain copies
        num_carved=a.num_carved,
        ref=[list(r) for r in mgr.ref],
        keys=[dict(k) for k in mgr.evictor.keys],
        index=[dict(t) for t in mgr.index.table],
        requests=reqs,
        hit_tokens=(mgr.prefix_hit_tokens, mgr.prefix_query_tokens),
    )


def random_lookups(mgr: KVCacheManager, rng, check, n: int = 150) -> int:
    """Drive ``mgr`` (2-token pages) with ``n`` random prompts (one of 5 shared prefixes of 0-40
    tokens plus 1-8 own tokens; some lookups capped by ``max_tokens``), keeping 1-4 requests live
    and freeing the rest (so pages are live, cached and evicted), ``check_integrity`` every step.
    After each lookup ``check(req, prompt, cap, hit, bound)`` (``bound``: ``_hash_for_lookup``'s)
    asserts what the test proves; the number of times it returned true is returned."""
    prefixes = [[rng.randrange(1, 30) for _ in range(rng.randrange(0, 40))] for _ in range(5)]
    live, counted = [], 0
    for rid in range(n):
        prompt = rng.choice(prefixes) + [rng.randrange(1, 30) for _ in range(rng.randrange(1, 9))]
        mgr.add_request(rid, prompt)
        cap = rng.choice([None, None, rng.randrange(0, 48)])
        req = mgr.requests[rid]
        top = min(len(prompt) - 1, len(prompt) // 2 * 2)
        top = top if cap is None else max(0, min(top, cap))
        hit = mgr.lookup(rid, max_tokens=cap)
        counted += bool(check(req, prompt, cap, hit, mgr.hasher.for_lookup(req, top, mgr.ledger)))
        if mgr.allocate(rid, len(prompt) - hit) is None:
            mgr.free(rid)
            continue
        mgr.append_tokens(rid, [1])
        live.append(rid)
        while len(live) > rng.randrange(1, 5):
            mgr.free(live.pop(rng.randrange(len(live))))
        mgr.check_integrity()
    return counted


def write_model_dir(path, llm, gen_cfg: dict | None = None, tokenizer=None):
    """A local HF model directory with ``llm``'s config and weights (tied ``lm_head`` left out,
    as HF saves it), a ``generation_config.json`` only when ``gen_cfg`` is given, and tokenizer
    files only when a transformers ``tokenizer`` is given."""
    import json

    from safetensors.torch import save_file

    llm.config.save_pretrained(path)
    (path / "generation_config.json").unlink(missing_ok=True)
    state = {k: v for k, v in llm.model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(path / "model.safetensors"))
    if gen_cfg is not None:
        (path / "generation_config.json").write_text(json.dumps(gen_cfg))
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path
