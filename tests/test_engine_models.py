"""Paged models vs Hugging Face transformers (same random weights, fp32).

Each family runs several requests of different lengths through a test-only paged cache that
follows docs/memory-layout.md literally (one uint8 buffer, large pages split per group, layer
``j`` viewed at byte offset ``j·p_g`` with exec id ``s·n_g``), with chunked prefill, mixed
prefill/decode batches, and out-of-window pages released (``None``) and recycled to other
groups. Logits must match HF's full-sequence forward and greedy tokens HF ``generate``.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch
import transformers as tf

from jenga.engine.attention import ForwardContext, build_attention_metadata
from jenga.engine.models.common import LayerAttention
from jenga.engine.models.registry import build_model, model_class
from jenga.engine.models.weights import load_model, randomize_, tiny_config

HF_CLASSES = {
    "llama": tf.LlamaForCausalLM, "mistral": tf.MistralForCausalLM, "ministral": tf.MinistralForCausalLM,
    "gemma2": tf.Gemma2ForCausalLM, "gemma3": tf.Gemma3ForCausalLM, "llama4": tf.Llama4ForCausalLM,
}


class PagedCache:
    """Test-only KV cache laid out exactly as docs/memory-layout.md says."""

    def __init__(self, layers: list[LayerAttention], *, page_size: int = 16, num_large: int = 24,
                 dtype: torch.dtype = torch.float32, seed: int = 0):
        by_spec: dict[LayerAttention, list[int]] = defaultdict(list)
        for idx, info in enumerate(layers):
            by_spec[info].append(idx)
        self.B, self.dtype = page_size, dtype
        self.groups = list(by_spec.items())  # [(info, layer indices)]
        esize = torch.tensor([], dtype=dtype).element_size()
        self.p = [page_size * 2 * i.num_kv_heads * i.head_dim * esize for i, _ in self.groups]
        self.P = [len(ls) * p for (_, ls), p in zip(self.groups, self.p, strict=True)]
        self.S = math.lcm(*self.P)
        self.k = [self.S // P for P in self.P]
        gen = torch.Generator().manual_seed(seed)  # garbage (incl. NaN patterns) must never leak
        self.buffer = torch.randint(0, 256, ((num_large + 1) * self.S,), dtype=torch.uint8, generator=gen)
        self.views: list[torch.Tensor] = [None] * len(layers)
        for g, (info, ls) in enumerate(self.groups):
            p = self.p[g]
            # N·S/p_g pages reach every small page (max exec id N·k_g·n_g − n_g) and overrun the
            # last large page by j·p_g into the slack. (The doc's (N+1)·S/p_g − 1 would run past
            # the end of the buffer for j >= 2.)
            E = num_large * self.S // p
            for j, layer in enumerate(ls):
                raw = self.buffer[j * p: j * p + E * p].view(dtype)
                self.views[layer] = raw.view(E, 2, page_size, info.num_kv_heads, info.head_dim)
        self.free_large = list(range(num_large))
        self.free_small: list[list[int]] = [[] for _ in self.groups]
        self.used: dict[tuple[int, int], int] = defaultdict(int)  # (group, large page) -> used small pages
        self.pages: dict[int, list[list[int | None]]] = {}  # req -> per group small page ids
        self.computed: dict[int, int] = {}

    def _alloc(self, g: int) -> int:
        if not self.free_small[g]:
            L = self.free_large.pop(0)
            self.free_small[g] = [L * self.k[g] + i for i in range(self.k[g])]
        s = self.free_small[g].pop(0)
        self.used[g, s // self.k[g]] += 1
        return s

    def _free(self, g: int, s: int) -> None:
        L = s // self.k[g]
        self.used[g, L] -= 1
        self.free_small[g].append(s)
        if self.used[g, L] == 0:  # whole large page free: give it back so another group reuses the bytes
            self.free_small[g] = [x for x in self.free_small[g] if x // self.k[g] != L]
            self.free_large.append(L)

    def _needed_from(self, info: LayerAttention, c: int) -> int:
        if info.kind == "sliding":
            return max(0, c - info.window + 1)
        if info.kind == "chunked":
            return c // info.chunk * info.chunk
        return 0

    def context(self, batch: list[tuple[int, int]]) -> ForwardContext:
        """Prepare a step of ``[(req, num_new)]``: release unneeded pages, allocate, build metadata."""
        metas = []
        for g, (info, ls) in enumerate(self.groups):
            ids, computed, new = [], [], []
            for req, n in batch:
                c = self.computed.setdefault(req, 0)
                pages = self.pages.setdefault(req, [[] for _ in self.groups])[g]
                first = self._needed_from(info, c) // self.B
                for i in range(min(first, len(pages))):
                    if pages[i] is not None:
                        self._free(g, pages[i])
                        pages[i] = None
                while len(pages) * self.B < c + n:
                    pages.append(self._alloc(g))
                ids.append([None if s is None else s * len(ls) for s in pages])  # exec ids
                computed.append(c)
                new.append(n)
            metas.append((ls, build_attention_metadata(ids, computed, new, self.B, window=info.window,
                                                       chunk=info.chunk)))
        for req, n in batch:
            self.computed[req] += n
        return ForwardContext.from_groups(self.views, metas)


def make_pair(family: str, seed: int = 0):
    """(our model, HF model) with identical random weights; ours reloaded from HF's state dict."""
    config = tiny_config(family)
    config._attn_implementation = "eager"
    src = randomize_(build_model(config), seed=seed, std=0.05)
    with torch.no_grad():  # norms around 1 (Gemma: offset around 0)
        for name, p in src.named_parameters():
            if name.endswith("norm.weight") and family not in ("gemma2", "gemma3"):
                p.add_(1.0)
    hf = HF_CLASSES[family](config).eval()
    hf.load_state_dict(src.state_dict())
    ours = build_model(config)
    ours.load_state_dict(hf.state_dict())
    return ours, hf


def run_engine(model, prompts: list[list[int]], budget: int, gen: int):
    """Chunked prefill under a token budget, then decode; returns (tokens, logits per position)."""
    cache = PagedCache(model.layer_attention())
    seqs = [list(p) for p in prompts]
    done = [0] * len(prompts)  # tokens already fed
    logits = [dict() for _ in prompts]
    while any(len(s) - len(p) < gen for s, p in zip(seqs, prompts, strict=True)):
        batch, left = [], budget
        for r, s in enumerate(seqs):
            if len(s) - len(prompts[r]) >= gen or left == 0:
                continue
            n = min(len(s) - done[r], left)
            batch.append((r, n))
            left -= n
        ctx = cache.context(batch)
        ids = torch.tensor([t for r, n in batch for t in seqs[r][done[r]: done[r] + n]])
        pos = torch.cat([torch.arange(done[r], done[r] + n) for r, n in batch])
        with torch.no_grad():
            out = model(ids, pos, ctx)
        i = 0
        for r, n in batch:
            for k in range(n):
                logits[r][done[r] + k] = out[i + k]
            i += n
            done[r] += n
            if done[r] == len(seqs[r]):  # fed everything: sample greedily
                seqs[r].append(int(out[i - 1].argmax()))
    return seqs, logits


FAMILIES = ["llama", "mistral", "ministral", "gemma2", "gemma3", "llama4"]


@pytest.mark.parametrize("family", FAMILIES)
def test_matches_hf(family):
    torch.manual_seed(0)
    ours, hf = make_pair(family)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (75, 41, 20)]
    seqs, logits = run_engine(ours, prompts, budget=29, gen=6)
    with torch.no_grad():
        for r, seq in enumerate(seqs):
            ref = hf(torch.tensor([seq[:-1]])).logits[0]
            got = torch.stack([logits[r][t] for t in range(len(seq) - 1)])
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
            want = hf.generate(torch.tensor([prompts[r]]), max_new_tokens=6, do_sample=False,
                               attention_mask=torch.ones(1, len(prompts[r]), dtype=torch.long),
                               pad_token_id=0)[0].tolist()
            assert seq == want, f"request {r}: greedy tokens differ from HF generate"


def test_logits_indices_select_rows():
    ours, _ = make_pair("mistral")
    cache = PagedCache(ours.layer_attention())
    ids, pos = torch.randint(0, 512, (30,)), torch.cat([torch.arange(18), torch.arange(12)])
    with torch.no_grad():
        full = ours(ids, pos, cache.context([(0, 18), (1, 12)]))
    cache = PagedCache(ours.layer_attention())
    with torch.no_grad():
        last = ours(ids, pos, cache.context([(0, 18), (1, 12)]), torch.tensor([17, 29]))
    torch.testing.assert_close(last, full[[17, 29]])


def test_layer_kinds_and_specs():
    kinds = {f: [a.kind for a in build_model(tiny_config(f)).layer_attention()] for f in FAMILIES}
    assert kinds["llama"] == ["full"] * 2
    assert kinds["mistral"] == ["sliding"] * 2
    assert kinds["ministral"] == ["sliding", "full", "sliding"]
    assert kinds["gemma2"] == kinds["gemma3"] == ["sliding", "full", "sliding", "full"]
    assert kinds["llama4"] == ["chunked", "chunked", "chunked", "full"]
    specs = build_model(tiny_config("gemma2")).layer_cache_specs("g2", "fp32")
    assert specs[0].kind == "sliding" and specs[0].window == 32 and specs[1].kind == "full"
    assert specs[0].layer_page_bytes(16) == 16 * 2 * 2 * 64 * 4


def test_registry_resolves_multimodal_wrappers():
    assert model_class(tf.Gemma3Config()).__name__ == "Gemma3ForCausalLM"
    assert model_class(tf.Llama4Config()).__name__ == "Llama4ForCausalLM"
    assert model_class(tf.MistralConfig()).__name__ == "LlamaForCausalLM"
    with pytest.raises(ValueError, match="unsupported"):
        model_class(tf.GPT2Config())


@pytest.mark.parametrize("family,shard", [("llama4", "200KB"), ("gemma3", None)])
def test_load_safetensors_checkpoint(tmp_path, family, shard):
    _, hf = make_pair(family, seed=3)
    kwargs = {"max_shard_size": shard} if shard else {}
    hf.save_pretrained(tmp_path, **kwargs)
    assert (tmp_path / "model.safetensors.index.json").exists() == bool(shard)
    model = load_model(tmp_path)
    ref = hf.state_dict()
    for name, p in model.state_dict().items():
        torch.testing.assert_close(p, ref[name], atol=0, rtol=0)
