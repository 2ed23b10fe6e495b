#!/usr/bin/env bash
# jenga inside vLLM on a CUDA machine: greedy equality with stock vLLM and the side-by-side
# benchmark on the FlashAttention and FlashInfer backends, with a random-weight model of
# Gemma-3-4B's shape.  Needs a CUDA build of vLLM 0.34 (`pip install vllm==0.34.0`; 0.32 and 0.33
# are supported too) and jenga installed (`pip install -e .`, which registers the
# vllm.general_plugins entry point).
# Exits 0 with a message when there is no GPU or no vLLM.
set -euo pipefail
PY=${PYTHON:-python}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU here; nothing to check (this script is for a CUDA machine)"; exit 0
fi
if ! "$PY" -c "import vllm, torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
  echo "gpu_check: vLLM with CUDA is not importable by $PY; install vllm==0.34.0 and jenga first"; exit 0
fi
"$PY" -c "import vllm; from jenga.vllm import compat; compat.check_version(); print('gpu_check: vLLM', vllm.__version__)"
HERE=$(cd "$(dirname "$0")" && pwd)
for backend in FLASH_ATTN FLASHINFER; do
  echo "== attention backend $backend"
  VLLM_ATTENTION_BACKEND=$backend "$PY" - "$HERE" <<'PY'
import os, random, sys, tempfile
from pathlib import Path
import torch, transformers as tf
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
# Gemma-3-4B's text shape (34 layers, 5 sliding : 1 full, window 1024), random weights
cfg = tf.Gemma3TextConfig(vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
                          num_attention_heads=8, num_key_value_heads=4, head_dim=256, sliding_window=1024,
                          query_pre_attn_scalar=256, max_position_embeddings=8192)
cfg.dtype = "bfloat16"
out = Path(tempfile.mkdtemp(prefix="jenga-gpu-")) / "gemma3-4b-shape"
torch.manual_seed(0)
with torch.device("cuda"):
    model = tf.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
model.save_pretrained(out)
del model
torch.cuda.empty_cache()
rng = random.Random(0)
article = [rng.randrange(3, 200000) for _ in range(3000)]
prompts = [article + [rng.randrange(3, 200000) for _ in range(40)] for _ in range(8)]
sp = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
res = {}
for side in ("stock", "jenga"):
    kw = dict(model=str(out), dtype="bfloat16", max_model_len=8192, gpu_memory_utilization=0.5,
              num_gpu_blocks_override=2048, skip_tokenizer_init=True, seed=0)
    if side == "jenga":
        kw["scheduler_cls"] = "jenga.vllm.JengaScheduler"
    llm = LLM(**kw)
    first = llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], sp, use_tqdm=False)
    rest = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts[1:]], sp, use_tqdm=False)
    outs = first + rest
    res[side] = [o.outputs[0].token_ids for o in outs]
    hit = sum(o.num_cached_tokens or 0 for o in outs) / sum(len(o.prompt_token_ids) for o in outs)
    print(f"{side}: prefix hit rate {hit:.1%}")
    del llm
    torch.cuda.empty_cache()
same = sum(a == b for a, b in zip(res["stock"], res["jenga"]))
print(f"greedy outputs equal for {same}/{len(prompts)} requests")
sys.exit(0 if same == len(prompts) else 1)
PY
done
echo "== side-by-side (the CPU benchmark's workloads, on this GPU)"
"$PY" "$HERE/vllm_side_by_side.py" --quick --dtype bfloat16
