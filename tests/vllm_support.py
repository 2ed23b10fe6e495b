"""Shared by the vLLM integration tests: tiny random-weight model folders, engines, workloads.

Each test module builds one stock engine and one jenga engine (same model, same KV
budget), runs the same workloads through both and compares greedy tokens.  Engines run
in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the tests can read the jenga
manager behind the scheduler.
"""

from __future__ import annotations

import gc
import json
import os
import random
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers as tf  # noqa: E402
import vllm  # noqa: E402  (conftest.py leaves the vLLM modules out only when vLLM is not installed)
from vllm import envs as vllm_envs  # noqa: E402

from jenga.engine.tokenizer import tiny_tokenizer  # noqa: E402

JENGA = "jenga.vllm.JengaScheduler"
BLOCK = 32  # vLLM's CPU kernels want multiples of 32 tokens per block
_COMMON = dict(vocab_size=512, hidden_size=128, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
               head_dim=64, max_position_embeddings=2048, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def hf_config(family: str):
    """A tiny HF config: head_dim 64, windows / chunks of 64 tokens (two blocks), page sizes
    that differ between groups (more layers of one kind than of the other)."""
    if family == "gemma3":
        return tf.Gemma3TextConfig(**_COMMON, num_hidden_layers=6, sliding_window=64, query_pre_attn_scalar=64,
                                   layer_types=["sliding_attention"] * 5 + ["full_attention"])
    if family == "llama4":
        return tf.Llama4TextConfig(**_COMMON, num_hidden_layers=4, intermediate_size_mlp=128, num_local_experts=2,
                                   num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layers=[1, 1, 1, 0],
                                   attention_chunk_size=64, use_qk_norm=True)
    if family == "gptoss":
        return tf.GptOssConfig(**_COMMON, num_hidden_layers=3, num_local_experts=2, num_experts_per_tok=1,
                               layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                               sliding_window=64)
    if family == "llama":
        return tf.LlamaConfig(**_COMMON, num_hidden_layers=2)
    if family == "gemma2":  # alternating sliding / full, attention and final logit soft-capping
        return tf.Gemma2Config(**_COMMON, num_hidden_layers=4, sliding_window=64, query_pre_attn_scalar=64,
                               layer_types=["sliding_attention", "full_attention"] * 2,
                               attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    if family == "ministral":  # Mistral architecture with Ministral-style interleaved windows (vLLM reads layer_types)
        return tf.MistralConfig(**_COMMON, num_hidden_layers=4, sliding_window=64,
                                layer_types=["sliding_attention"] * 3 + ["full_attention"])
    if family == "qwen3_next":  # 3 Gated DeltaNet layers : 1 gated full-attention layer (runs in bf16 on CPU)
        return tf.Qwen3NextConfig(**_COMMON, num_hidden_layers=4, decoder_sparse_step=2,
                                  layer_types=["linear_attention", "full_attention"] + ["linear_attention"] * 2,
                                  linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=64,
                                  linear_value_head_dim=64, linear_conv_kernel_dim=4, num_experts=4,
                                  num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                  partial_rotary_factor=0.5)
    if family == "falcon_h1":  # attention and Mamba-2 side by side in both layers (fp32 on CPU)
        return tf.FalconH1Config(**_COMMON, num_hidden_layers=2, mamba_n_heads=4, mamba_d_head=32, mamba_d_ssm=128,
                                 mamba_n_groups=2, mamba_d_state=32, mamba_d_conv=4, mamba_chunk_size=16,
                                 mamba_rms_norm=True)
    raise ValueError(family)


def randomized(model, *, unit_norm=lambda name: name.endswith("norm.weight")):
    """``model`` with small random weights drawn from torch's generator (the caller seeds it before
    building the model) and the norms ``unit_norm`` names around 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.05)
            if unit_norm(name):
                p.add_(1.0)
    return model


def save_tiny_tokenizer(out: Path) -> None:
    """The byte-level BPE tokenizer of the tiny models, saved next to a model."""
    tf.PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer(512).backend, bos_token="<bos>", eos_token="<eos>",
                               pad_token="<pad>").save_pretrained(out)


def model_dir(family: str, root: Path) -> str:
    """Write the tiny model (seeded random weights, byte-level BPE tokenizer) under ``root``."""
    out = root / family
    if (out / "config.json").exists():
        return str(out)
    cfg = hf_config(family)
    cfg.dtype = "float32"
    torch.manual_seed(0)
    model = randomized(tf.AutoModelForCausalLM.from_config(cfg),  # Gemma's norms scale by 1 + weight
                       unit_norm=lambda name: name.endswith("norm.weight") and family not in ("gemma3", "gemma2"))
    model.save_pretrained(out)
    save_tiny_tokenizer(out)
    return str(out)


def draft_dir(target: str, root: Path, *, noise: float = 0.01) -> str:
    """A draft model for ``target``: its weights plus seeded noise (same vocabulary and
    tokenizer), so that some of its proposals are accepted and some rejected."""
    out = root / (Path(target).name + "-draft")
    if (out / "config.json").exists():
        return str(out)
    torch.manual_seed(1)
    model = tf.AutoModelForCausalLM.from_pretrained(target)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * noise)
    model.save_pretrained(out)
    tf.AutoTokenizer.from_pretrained(target).save_pretrained(out)
    return str(out)


def eagle_dir(target: str, root: Path) -> str:
    """An EAGLE head for the tiny Llama ``target`` in vLLM's ``EagleLlamaForCausalLM`` format: the
    target's embeddings, one decoder layer (a copy of the target's last, no input norm) and ``fc``
    (the hidden-state half near identity).  Its proposals are random-quality: vLLM rejects most."""
    import shutil

    from safetensors.torch import load_file, save_file

    out = root / (Path(target).name + "-eagle")
    if (out / "config.json").exists():
        return str(out)
    cfg = json.loads((Path(target) / "config.json").read_text())
    weights = load_file(Path(target) / "model.safetensors")
    last, hidden = f"model.layers.{cfg['num_hidden_layers'] - 1}.", cfg["hidden_size"]
    tensors = {"embed_tokens.weight": weights["model.embed_tokens.weight"].clone()}
    tensors.update({k.replace(last, "layers.0."): v.clone() for k, v in weights.items()
                    if k.startswith(last) and "input_layernorm" not in k})
    gen = torch.Generator().manual_seed(3)
    fc = torch.randn(hidden, 2 * hidden, generator=gen) * 0.01
    fc[:, hidden:] += torch.eye(hidden)
    tensors["fc.weight"] = fc
    out.mkdir(parents=True)
    save_file(tensors, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1,
                                                 "architectures": ["EagleLlamaForCausalLM"]}))
    for f in Path(target).glob("tok*"):
        shutil.copy(f, out)
    return str(out)


def eagle3_dir(target: str, root: Path) -> str:
    """An EAGLE-3 head for the tiny Llama ``target`` in the published EAGLE-3 format that vLLM's
    ``Eagle3LlamaForCausalLM`` loads (transformers has no EAGLE-3 class, so the weights are written
    with safetensors from the target's): ``midlayer.*`` (one decoder layer whose q / k / v read the
    concatenated [token embedding, hidden state], plus ``hidden_norm``), ``fc`` over three of the
    target's hidden states (``eagle_aux_hidden_state_layer_ids`` 0, 1, 2), ``norm`` and an
    ``lm_head`` over a draft vocabulary of 3/4 of the target's with its ``d2t`` offsets.  ``fc``
    passes the last layer's state through and ``norm`` / ``lm_head`` are the target's, the layer's
    outputs are small noise: the head mostly proposes the target's last token again, so vLLM
    accepts it in repetitions and rejects it elsewhere (and never proposes ids outside its vocabulary)."""
    import shutil

    from safetensors.torch import load_file, save_file

    out = root / (Path(target).name + "-eagle3")
    if (out / "config.json").exists():
        return str(out)
    cfg = json.loads((Path(target) / "config.json").read_text())
    w = load_file(Path(target) / "model.safetensors")
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    gen = torch.Generator().manual_seed(4)

    def noise(*shape, scale=0.01):
        return torch.randn(*shape, generator=gen) * scale

    kept = torch.tensor([i for i in range(vocab) if i % 4 != 3])  # the draft vocabulary
    lm_head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    kv, heads, hd = cfg["num_key_value_heads"], cfg["num_attention_heads"], cfg["head_dim"]
    fc = torch.zeros(hidden, 3 * hidden)
    fc[:, 2 * hidden:] = torch.eye(hidden)
    t = {"fc.weight": fc, "norm.weight": w["model.norm.weight"].clone(), "lm_head.weight": lm_head[kept].clone(),
         "d2t": kept - torch.arange(len(kept)), "t2d": torch.isin(torch.arange(vocab), kept),
         "midlayer.hidden_norm.weight": torch.ones(hidden), "midlayer.input_layernorm.weight": torch.ones(hidden),
         "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
         "midlayer.self_attn.q_proj.weight": noise(heads * hd, 2 * hidden, scale=0.05),
         "midlayer.self_attn.k_proj.weight": noise(kv * hd, 2 * hidden, scale=0.05),
         "midlayer.self_attn.v_proj.weight": noise(kv * hd, 2 * hidden, scale=0.05),
         "midlayer.self_attn.o_proj.weight": noise(hidden, heads * hd),
         "midlayer.mlp.gate_proj.weight": noise(cfg["intermediate_size"], hidden, scale=0.05),
         "midlayer.mlp.up_proj.weight": noise(cfg["intermediate_size"], hidden, scale=0.05),
         "midlayer.mlp.down_proj.weight": noise(hidden, cfg["intermediate_size"])}
    out.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in t.items()}, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps({
        **cfg, "num_hidden_layers": 1, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": len(kept),
        "target_hidden_size": hidden, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}))
    for f in Path(target).glob("tok*"):
        shutil.copy(f, out)
    return str(out)


def mimo_dir(root: Path) -> str:
    """A tiny MiMo target with one MTP layer: transformers' ``Qwen2ForCausalLM`` (MiMo's dense
    architecture; transformers has no MiMo class) saved with ``save_pretrained``, its config given
    MiMo's architecture name and ``num_nextn_predict_layers: 1``, and the MTP layer's weights
    (``model.mtp_layers.0.*``, which transformers' classes do not hold) written with safetensors
    next to the saved weights: the target's last decoder layer plus noise, ``input_proj`` passing
    the hidden-state half through, ``final_layernorm`` the target's final norm."""
    from safetensors.torch import load_file, save_file

    out = root / "mimo"
    if (out / "config.json").exists():
        return str(out)
    cfg = tf.Qwen2Config(**_COMMON, num_hidden_layers=2, dtype="float32")
    torch.manual_seed(0)
    randomized(tf.Qwen2ForCausalLM(cfg)).save_pretrained(out)
    save_tiny_tokenizer(out)
    w = load_file(out / "model.safetensors")
    last, hidden = f"model.layers.{cfg.num_hidden_layers - 1}.", cfg.hidden_size
    gen = torch.Generator().manual_seed(5)
    mtp = {k.replace(last, "model.mtp_layers.0."): v + torch.randn(v.shape, generator=gen) * 0.01
           for k, v in w.items() if k.startswith(last)}
    proj = torch.randn(hidden, 2 * hidden, generator=gen) * 0.01
    proj[:, :hidden] += torch.eye(hidden)  # [previous hidden state, token embedding] -> hidden
    mtp.update({"model.mtp_layers.0.input_proj.weight": proj,
                "model.mtp_layers.0.token_layernorm.weight": torch.ones(hidden),
                "model.mtp_layers.0.hidden_layernorm.weight": torch.ones(hidden),
                "model.mtp_layers.0.final_layernorm.weight": w["model.norm.weight"].clone()})
    save_file({k: v.contiguous() for k, v in mtp.items()}, out / "mtp.safetensors")
    conf = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**conf, "architectures": ["MiMoForCausalLM"],
                                                 "num_nextn_predict_layers": 1}))
    return str(out)


def qwen3_next_mtp_dir(root: Path) -> str:
    """The tiny Qwen3-Next (every layer's MLP a mixture of experts: vLLM's Qwen3-Next MTP model
    wants its MTP layer to be one) with one MTP layer: transformers' ``Qwen3NextForCausalLM``
    saved with ``save_pretrained``, ``num_nextn_predict_layers: 1`` in its config, and the
    ``mtp.*`` weights (which transformers' class does not hold: the full-attention layer's
    weights, ``fc`` passing the hidden-state half through, the norms) written with safetensors."""
    from safetensors.torch import load_file, save_file

    out = root / "qwen3_next_mtp"
    if (out / "config.json").exists():
        return str(out)
    cfg = hf_config("qwen3_next")
    cfg.decoder_sparse_step, cfg.dtype = 1, "float32"
    torch.manual_seed(0)
    randomized(tf.AutoModelForCausalLM.from_config(cfg)).save_pretrained(out)
    save_tiny_tokenizer(out)
    w = load_file(out / "model.safetensors")
    full, hidden = f"model.layers.{cfg.layer_types.index('full_attention')}.", cfg.hidden_size
    mtp = {k.replace(full, "mtp.layers.0."): v.clone() for k, v in w.items() if k.startswith(full)}
    fc = torch.zeros(hidden, 2 * hidden)
    fc[:, hidden:] = torch.eye(hidden)
    mtp.update({"mtp.fc.weight": fc, "mtp.norm.weight": w["model.norm.weight"].clone(),
                "mtp.pre_fc_norm_hidden.weight": torch.zeros(hidden),
                "mtp.pre_fc_norm_embedding.weight": torch.zeros(hidden)})
    save_file({k: v.contiguous() for k, v in mtp.items()}, out / "mtp.safetensors")
    conf = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**conf, "num_nextn_predict_layers": 1}))
    return str(out)


def lora_dir(target: str, root: Path, name: str, *, seed: int, rank: int = 8) -> str:
    """A random LoRA adapter for ``target`` in PEFT's on-disk format (``adapter_config.json`` +
    ``adapter_model.safetensors``) on the attention projections q / k / v / o."""
    from safetensors.torch import save_file

    out = root / f"{Path(target).name}-lora-{name}"
    if (out / "adapter_config.json").exists():
        return str(out)
    cfg = tf.AutoConfig.from_pretrained(target)
    heads, kv, hd, hidden = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
    shapes = {"q_proj": (heads * hd, hidden), "k_proj": (kv * hd, hidden), "v_proj": (kv * hd, hidden),
              "o_proj": (hidden, heads * hd)}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(cfg.num_hidden_layers):
        for proj, (fan_out, fan_in) in shapes.items():
            key = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=gen) * 0.2
            tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen) * 0.2
    out.mkdir(parents=True)
    save_file(tensors, out / "adapter_model.safetensors")
    (out / "adapter_config.json").write_text(json.dumps(dict(
        peft_type="LORA", task_type="CAUSAL_LM", base_model_name_or_path=target, r=rank, lora_alpha=2 * rank,
        lora_dropout=0.0, bias="none", fan_in_fan_out=False, target_modules=list(shapes))))
    return str(out)


def allow_engines_after_numba() -> None:
    """vLLM 0.32's CPU platform rebinds its kernel overrides at every engine start by scanning
    every module with ``hasattr(value, "__dict__")``; llvmlite's library wrapper answers any
    attribute (``__dict__`` included) with a function wrapper, so once vLLM's n-gram proposer has
    imported numba, every later engine in the process fails to start.  Giving the wrapper an
    empty ``__dict__`` answer (it caches looked-up names in a table) lets the scan pass it by."""
    from llvmlite.binding import ffi

    ffi.lib._fntab.setdefault("__dict__", {})


def spec_stats(llm) -> dict[str, int]:
    """vLLM's speculative-decoding counters of ``llm`` (``disable_log_stats=False``)."""
    out = {}
    for m in llm.get_metrics():
        if m.name in ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"):
            out[m.name.split("num_")[1]] = int(m.value)
    return out


def engine(path: str, *, jenga: bool, num_blocks: int | None = None, **kw):
    """A vLLM engine over ``path`` (fp32, eager, 32-token blocks); ``num_blocks`` sets the KV budget
    to that many of vLLM's own blocks (the same bytes with and without jenga)."""
    args = dict(model=path, dtype="float32", enforce_eager=True, max_model_len=512, block_size=BLOCK,
                max_num_seqs=8, seed=0, kv_cache_memory_bytes=16 << 20, num_gpu_blocks_override=num_blocks)
    if jenga:
        args["scheduler_cls"] = JENGA
    args.update(kw)
    # an engine core caches vLLM's environment variables for the process once it starts; each
    # engine here reads the environment as it is now (a test's setenv, e.g. the TP thread binding)
    vllm_envs.disable_envs_cache()
    return vllm.LLM(**args)


def close(llm) -> None:
    """Shut ``llm``'s in-process engine core down; a jenga scheduler's ``/metrics`` snapshot goes with it."""
    snapshots = getattr(scheduler(llm), "snapshots", None)  # a jenga scheduler's, with vLLM's stats on
    llm.llm_engine.engine_core.shutdown()
    if snapshots is not None:
        assert not snapshots.path.exists(), "the engine core shut down and its snapshot stayed"
    del llm
    gc.collect()
    # the next engine in this process builds its own parallel groups (a MoE model's expert group
    # is made only when the first engine of the process is one)
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()


def scheduler(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def workloads(seed: int = 0) -> dict[str, list[list[int]]]:
    """``shared``: a lone request, then six more sharing its 150-token prefix (hits, no
    pressure).  ``pressure``: eight longer prompts over two shared documents, more than the
    small budget holds at once (preemption and eviction)."""
    rng = random.Random(seed)

    def toks(n):
        return [rng.randrange(3, 500) for _ in range(n)]

    base = toks(150)
    docs = [toks(200), toks(200)]
    return {
        "first": [base + toks(20)],
        "shared": [base + toks(rng.randrange(5, 40)) for _ in range(6)],
        "pressure": [docs[i % 2] + toks(rng.randrange(10, 50)) for i in range(8)],
    }


def greedy(llm, prompts, max_tokens: int = 32) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def run_all(llm) -> dict[str, list[list[int]]]:
    w = workloads()
    return {name: greedy(llm, prompts) for name, prompts in w.items()}


def compare(family: str, root: Path, *, tight_blocks: int, tight_kw: dict | None = None,
            engine_kw: dict | None = None, stock_kw: dict | None = None, extra: dict | None = None,
            extra_tokens: int = 32, tight_env: dict | None = None) -> dict:
    """Stock vLLM (ample memory) gives the reference tokens of every workload; jenga runs
    ``first`` + ``shared`` with ample memory and ``pressure`` with ``tight_blocks`` of budget.
    ``engine_kw`` goes to every engine (e.g. the dtype), ``stock_kw`` to the stock one only;
    ``extra``: more workloads (name -> rounds of prompts, ``extra_tokens`` new tokens each) stock
    runs for a caller's own engines; ``tight_env``: environment switches the tight engine is built
    with (``JENGA_VLLM_*``)."""
    path = model_dir(family, root)
    w = workloads()
    kw = engine_kw or {}
    stock = engine(path, jenga=False, **{**kw, **(stock_kw or {})})
    ref = run_all(stock)
    for name, rounds in (extra or {}).items():
        ref[name] = [out for prompts in rounds for out in greedy(stock, prompts, extra_tokens)]
    close(stock)
    ample = engine(path, jenga=True, **kw)
    got = {k: greedy(ample, w[k]) for k in ("first", "shared")}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in (tight_env or {}).items():
            mp.setenv(k, v)
        tight = engine(path, jenga=True, num_blocks=tight_blocks, max_model_len=320, **{**kw, **(tight_kw or {})})
    got["pressure"] = greedy(tight, w["pressure"])
    return dict(ref=ref, got=got, ample=scheduler(ample), tight=scheduler(tight), engines=(ample, tight))


def check_ample(runs: dict, *, min_hit_tokens: int) -> None:
    sched = runs["ample"]
    assert runs["got"]["first"] == runs["ref"]["first"]
    assert runs["got"]["shared"] == runs["ref"]["shared"]
    assert sched.num_preemptions == 0
    assert sched.jenga.stats().prefix_hit_tokens >= min_hit_tokens


def check_tight(runs: dict) -> None:
    assert runs["got"]["pressure"] == runs["ref"]["pressure"]
    check_pressure_effects(runs["tight"])


def check_pressure_effects(sched) -> None:
    """The tight budget did what it is for: jenga's scheduler preempted, evicted and still hit."""
    st = sched.jenga.stats()
    assert sched.num_preemptions > 0 and st.evicted_pages > 0 and st.prefix_hit_tokens > 0, (sched.num_preemptions, st)


def check_reclaimed(runs: dict) -> None:
    check_pages_reclaimed(runs["ample"], runs["tight"])


def check_pages_reclaimed(*schedulers) -> None:
    """Every page back in each jenga scheduler's pool, no request left, the pool consistent."""
    for sched in schedulers:
        mgr = sched.jenga
        assert mgr.used_bytes == 0 and not mgr.requests
        mgr.check_integrity()
