#!/usr/bin/env bash
# GPU checks, one command of a few minutes on one CUDA GPU (sized for an H200):
#   1. jenga's own engine on CUDA equals HF transformers for every engine family
#      (tests/test_engine_device.py with JENGA_TEST_DEVICE=cuda: tokens and logits, fp32)
#   2. `jenga bench` at a realistic shape: Gemma-3-4B's text config, random bf16 weights,
#      jenga vs paged on the same workload
#   3. only where a CUDA build of vLLM 0.32-0.34 is importable (`pip install vllm==0.34.0`): jenga inside vLLM, greedy equality with
#      stock vLLM (FlashAttention and FlashInfer) and the side-by-side benchmark
#   4. the host tier inside vLLM (same condition; benchmarks/vllm_host_gpu.py): `--kv-offloading-size` with
#      jenga's scheduler (jenga's per-kind host tier, copies by JengaConnector in the worker) next to stock
#      vLLM's own offloading connector, the same host bytes, on many articles asked cyclically: prompt
#      tokens computed, hits, host hits, tokens/s, greedy tokens equal to stock's.  GPU_CHECK_NEED_VLLM=1 makes
#      parts 3-4 fail (exit 1, naming what is missing) instead of being skipped without CUDA or vLLM.
# Installs nothing; runs jenga from this checkout's src/ (PYTHONPATH).  Results go under
# $OUT (or $JENGA_GPU_OUT, default ./gpu_check_out): one log per part and summary.txt, which is
# also printed at the end.  Exits 0 with a message when there is no CUDA GPU.
# Knobs: PYTHON, BENCH_REQUESTS (64), BENCH_KV (16GiB), PART_TIMEOUT (seconds per part, 300), HOST_TIMEOUT (part 4, 900);
# GPU_CHECK_DEVICE=cpu GPU_CHECK_SMALL=1 runs parts 1-2 on the CPU at a toy shape (to test this script).
set -uo pipefail
PY=${PYTHON:-python}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
RES=${OUT:-${JENGA_GPU_OUT:-./gpu_check_out}}
mkdir -p "$RES"
SUMMARY="$RES/summary.txt"
: > "$SUMMARY"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
say() { echo "$*" | tee -a "$SUMMARY"; }
T=${PART_TIMEOUT:-300}
DEV=${GPU_CHECK_DEVICE:-cuda}

if [ "$DEV" = cuda ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  if [ -n "${GPU_CHECK_NEED_VLLM:-}" ]; then
    say "gpu_check: FAILED: GPU_CHECK_NEED_VLLM is set and no CUDA device is visible to $PY (or no torch): parts 3-4 (jenga inside vLLM, its host tier) need one"
    exit 1
  fi
  say "gpu_check: no CUDA device visible to $PY (or no torch); nothing to check (this script is for a CUDA machine)"
  exit 0
fi
if ! "$PY" -c "import jenga.engine.llm" >"$RES/import.log" 2>&1; then
  say "gpu_check: jenga's engine does not import from $ROOT/src with $PY (missing dependencies?); see $RES/import.log"
  tail -3 "$RES/import.log"
  exit 1
fi
say "gpu_check $(date -u +%FT%TZ): $("$PY" -c "import torch, transformers as t; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu', '| torch', torch.__version__, '| transformers', t.__version__)")"
say "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
status=0

# 1. engine vs HF on CUDA, every engine family
echo "== 1. engine vs HF transformers on $DEV"
# (run as a script: the same checks as its pytest form, without needing pytest or the test suite's plugins)
JENGA_TEST_DEVICE=$DEV timeout "$T" "$PY" "$ROOT/tests/test_engine_device.py" >"$RES/engine_hf.log" 2>&1
rc=$?
grep -E "HF-equal on|FAILED|families equal" "$RES/engine_hf.log" | sed 's/^/  /' | tee -a "$SUMMARY"
[ $rc -eq 0 ] && say "1. engine vs HF on $DEV: ok" || { say "1. engine vs HF on $DEV: FAILED (rc $rc, $RES/engine_hf.log)"; status=1; }

# 2. jenga bench at Gemma-3-4B's shape (random weights)
echo "== 2. jenga bench, Gemma-3-4B text shape, bf16, on $DEV"
MODEL_DIR="$RES/gemma3-4b-shape"
SHAPE=(--prompt-min 1024 --prompt-max 3072 --output-len 64 --shared-prefix 512 --max-num-batched-tokens 4096)
[ -n "${GPU_CHECK_SMALL:-}" ] && SHAPE=(--prompt-min 100 --prompt-max 300 --output-len 8 --shared-prefix 32 --max-num-batched-tokens 512)
GPU_CHECK_SMALL=${GPU_CHECK_SMALL:-} "$PY" - "$MODEL_DIR" <<'PY' >"$RES/bench_model.log" 2>&1
import sys
import transformers as tf
# Gemma-3-4B's text config (34 layers, 5 sliding : 1 full, window 1024); config only: the
# engine draws random weights (--random-weights is bench's only mode)
import os
cfg = tf.Gemma3TextConfig(vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
                          num_attention_heads=8, num_key_value_heads=4, head_dim=256, sliding_window=1024,
                          query_pre_attn_scalar=256, max_position_embeddings=8192)
if os.environ.get("GPU_CHECK_SMALL"):  # a toy of the same pattern, to test this script on a CPU
    cfg = tf.Gemma3TextConfig(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=64, sliding_window=64,
                              query_pre_attn_scalar=64, max_position_embeddings=4096)
cfg.save_pretrained(sys.argv[1])
PY
timeout "$T" "$PY" -m jenga.cli bench --model "$MODEL_DIR" --device "$DEV" --dtype bf16 \
  --kv-memory "${BENCH_KV:-16GiB}" --requests "${BENCH_REQUESTS:-64}" "${SHAPE[@]}" --json \
  >"$RES/bench.json" 2>"$RES/bench.log"
rc=$?
if [ $rc -eq 0 ]; then
  "$PY" - "$RES/bench.json" <<'PY' | tee -a "$SUMMARY"
import json, sys
d = json.load(open(sys.argv[1]))
print(f"2. jenga bench {d['requests']} requests, {d['prompt_tokens']} prompt tokens, output {d['output_len']}, "
      f"KV {d['kv_memory_bytes'] / 2**20:.0f} MiB, {d['dtype']} on {d['device']}:")
for name, r in d["managers"].items():
    print(f"  {name:6s} {r['tokens_per_s']:9.1f} tok/s  wall {r['wall_s']:6.1f} s  decode batch {r['decode_batch_mean']:5.1f}"
          f"  max running {r['max_running']:3d}  preemptions {r['preemptions']:3d}  prefix hit {r['prefix_hit_rate']:.1%}")
if "ratio_tokens_per_s" in d:
    print(f"  jenga / paged tokens/s: {d['ratio_tokens_per_s']:.2f}x")
PY
else
  say "2. jenga bench: FAILED (rc $rc; 124 = over ${T}s), see $RES/bench.log"; tail -3 "$RES/bench.log"; status=1
fi

# 3. jenga inside vLLM (skipped without vLLM, or failed with GPU_CHECK_NEED_VLLM)
skip_vllm() {  # $1: the part's name, $2: why it cannot run
  if [ -n "${GPU_CHECK_NEED_VLLM:-}" ]; then say "$1: FAILED ($2; GPU_CHECK_NEED_VLLM is set)"; status=1
  else say "$1: skipped ($2)"; fi
}
if [ "$DEV" != cuda ]; then
  skip_vllm "3. jenga inside vLLM" "not on cuda"
elif ! "$PY" -c "import vllm" >/dev/null 2>&1; then
  skip_vllm "3. jenga inside vLLM" "vLLM is not installed here"
elif ! "$PY" -c "from jenga.vllm import compat; compat.check_version()" >"$RES/vllm_version.log" 2>&1; then
  say "3. jenga inside vLLM: FAILED, unsupported vLLM version ($(tail -1 "$RES/vllm_version.log"))"; status=1
else
  for backend in FLASH_ATTN FLASHINFER; do
    echo "== 3. vLLM + jenga, attention backend $backend"
    VLLM_ATTENTION_BACKEND=$backend timeout "$T" "$PY" - "$RES" <<'PY' >"$RES/vllm_$backend.log" 2>&1
import random, sys, tempfile
from pathlib import Path
import torch, transformers as tf
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
# Gemma-3-4B's text shape (34 layers, 5 sliding : 1 full, window 1024), random weights
cfg = tf.Gemma3TextConfig(vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
                          num_attention_heads=8, num_key_value_heads=4, head_dim=256, sliding_window=1024,
                          query_pre_attn_scalar=256, max_position_embeddings=8192)
cfg.dtype = "bfloat16"
out = Path(tempfile.mkdtemp(prefix="jenga-gpu-", dir=sys.argv[1])) / "gemma3-4b-shape"
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
    rc=$?
    grep -E "prefix hit rate|greedy outputs equal" "$RES/vllm_$backend.log" | sed 's/^/  /' | tee -a "$SUMMARY"
    [ $rc -eq 0 ] && say "3. vLLM $backend: ok" || { say "3. vLLM $backend: FAILED (rc $rc)"; status=1; }
  done
  timeout "$T" "$PY" "$HERE/vllm_side_by_side.py" --quick >"$RES/vllm_side_by_side.log" 2>&1 \
    && say "3. side-by-side: see $RES/vllm_side_by_side.log" || { say "3. side-by-side: FAILED"; status=1; }
fi

# 4. the host tier inside vLLM: jenga's (--kv-offloading-size with jenga's scheduler) vs stock's own offloading.
# vllm_host_gpu.py exits 2 naming what is missing (no CUDA, no CUDA build of vLLM 0.32-0.34)
echo "== 4. host tier inside vLLM: jenga's vs stock vLLM's offloading, same host bytes"
if [ "$DEV" != cuda ]; then
  skip_vllm "4. host tier inside vLLM" "not on cuda"
else
  timeout "${HOST_TIMEOUT:-900}" "$PY" "$HERE/vllm_host_gpu.py" --markdown >"$RES/vllm_host.log" 2>&1
  rc=$?
  grep -E "^\| |FAILED|cannot run here" "$RES/vllm_host.log" | sed 's/^/  /' | tee -a "$SUMMARY"
  if [ $rc -eq 2 ]; then skip_vllm "4. host tier inside vLLM" "$(grep -o 'cannot run here: .*' "$RES/vllm_host.log" | head -1)"
  elif [ $rc -eq 0 ]; then say "4. host tier inside vLLM: ok ($RES/vllm_host.log)"
  else say "4. host tier inside vLLM: FAILED (rc $rc; 124 = over ${HOST_TIMEOUT:-900}s), see $RES/vllm_host.log"; status=1
  fi
fi

echo
echo "== summary ($SUMMARY)"
cat "$SUMMARY"
exit $status
