"""Every engine family vs HF transformers on the device named by ``JENGA_TEST_DEVICE``.

The same check as ``test_engine_e2e.py`` / ``test_engine_hybrid.py`` (greedy tokens equal HF
``generate``, each generated token's logits close), moved to a device: both the engine and HF's
own model class run there with the same fp32 weights, a batch of prompts of different lengths
under chunked prefill and a prefix hit; and the host KV tier there (``host-tier``: pinned host
pages, non-blocking copies on CUDA) equal to the same run without it and to HF.  ``benchmarks/gpu_check.sh`` runs it with
``JENGA_TEST_DEVICE=cuda`` as ``python tests/test_engine_device.py`` (no pytest needed there);
``JENGA_TEST_DEVICE=cuda pytest tests/test_engine_device.py`` runs the same checks.  Without the variable it is skipped: on the CPU the two files above hold it.
"""

from __future__ import annotations

import os
import sys

import torch

import jenga
from jenga import SamplingParams

DEVICE = os.environ.get("JENGA_TEST_DEVICE")
#: text families the engine runs (vision models: tests/test_engine_vlm.py, test_engine_mllama.py)
FAMILIES = ["tiny-llama", "tiny-mistral", "tiny-ministral", "tiny-gemma2", "tiny-gemma3", "tiny-llama4",
            "tiny-jamba", "tiny-nemotron-h", "tiny-falcon-h1", "tiny-qwen3-next"]
TOL = {"cpu": 1e-4}  # other devices: kernels sum in another order (TF32 is switched off below)


def check_family(name: str, device: str) -> str:
    """Raise unless ``name`` on ``device`` equals HF there; a one-line summary."""
    import transformers as tf

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    llm = jenga.LLM(name, kv_memory="8MiB", max_num_batched_tokens=48, device=device)
    gen = torch.Generator().manual_seed(0)
    shared = torch.randint(3, 512, (40,), generator=gen).tolist()
    prompts = [torch.randint(3, 512, (n,), generator=gen).tolist() for n in (7, 61, 130)]
    prompts.append(shared + prompts[0])
    params = SamplingParams(max_tokens=5, return_logits=True)
    outs = llm.generate(prompts[:3] + [shared + [9, 9]], params)
    outs += llm.generate([prompts[3]], params)  # after the shared prefix was cached: a hit
    hf = tf.AutoModelForCausalLM.from_config(llm.config).to(device).eval()
    hf.load_state_dict(llm.model.state_dict())
    tol = TOL.get(torch.device(device).type, 2e-3)
    worst = 0.0
    for out in outs:
        ids = torch.tensor([out.prompt_token_ids], device=device)
        with torch.no_grad():
            res = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(out.token_ids),
                              do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        want = res.sequences[0, ids.shape[1]:].tolist()
        assert out.token_ids == want, f"{name} on {device}: request {out.request_id}: tokens differ from HF"
        for got, ref in zip(out.logits, res.logits, strict=True):
            ref = ref[0].float().to(got.device)
            torch.testing.assert_close(got, ref, atol=tol, rtol=tol)
            worst = max(worst, float((got - ref).abs().max()))
    hit = llm.manager.stats().prefix_hit_tokens
    assert hit > 0, f"{name}: the shared prefix was not hit"
    return f"{name:16s} HF-equal on {device}: {len(outs)} requests, max |logit diff| {worst:.2e}, prefix hit {hit} tokens"


def check_host_tier(device: str) -> str:
    """tiny-gemma3 with a device pool of about two prompts and a host tier: four prompts, twice each
    in turn (the second round is served from host), equal to the run without the tier and to HF."""
    import transformers as tf

    gen = torch.Generator().manual_seed(1)
    docs = [torch.randint(3, 512, (n,), generator=gen).tolist() for n in (150, 140, 160, 130)]
    prompts = [d + torch.randint(3, 512, (5,), generator=gen).tolist() for d in docs * 2]
    params = SamplingParams(max_tokens=4, return_logits=True)
    runs = {}
    for host in (None, "4MiB"):
        llm = jenga.LLM("tiny-gemma3", kv_memory="1152KiB", max_num_batched_tokens=64, device=device,
                        host_kv_memory=host)
        runs[host] = (llm, [llm.generate([p], params)[0] for p in prompts])
    llm, outs = runs["4MiB"]
    st = llm.manager.stats()
    assert st.promotions > 0 and st.demotions > 0, f"host tier on {device}: no copies ({st.promotions}, {st.demotions})"
    assert llm.host_pool.layout.buffer.is_pinned() == (torch.device(device).type == "cuda")
    hf = tf.AutoModelForCausalLM.from_config(llm.config).to(device).eval()
    hf.load_state_dict(llm.model.state_dict())
    tol = TOL.get(torch.device(device).type, 2e-3)
    for out, base in zip(outs, runs[None][1], strict=True):
        assert out.token_ids == base.token_ids, f"host tier on {device}: request {out.request_id} differs"
        ids = torch.tensor([out.prompt_token_ids], device=device)
        with torch.no_grad():
            res = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(out.token_ids),
                              do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        assert out.token_ids == res.sequences[0, ids.shape[1]:].tolist(), f"host tier on {device}: HF differs"
        for got, ref in zip(out.logits, res.logits, strict=True):
            torch.testing.assert_close(got, ref[0].float().to(got.device), atol=tol, rtol=tol)
    return (f"{'host-tier':16s} HF-equal on {device}: {len(outs)} requests, {st.promotions} pages promoted, "
            f"{st.demotions} demoted, {st.host_hit_tokens} tokens served from host")


def check(name: str, device: str) -> str:
    return check_host_tier(device) if name == "host-tier" else check_family(name, device)


if DEVICE is not None and __name__ != "__main__":  # pytest collects the test only when a device is named
    import pytest

    @pytest.mark.parametrize("name", [*FAMILIES, "host-tier"])
    def test_family_equals_hf_on_device(name):
        print(check(name, DEVICE))


if __name__ == "__main__":  # no pytest on the machine: the same checks, one line each
    device = DEVICE or "cpu"
    failed = 0
    for fam in sys.argv[1:] or [*FAMILIES, "host-tier"]:
        try:
            print(check(fam, device), flush=True)
        except Exception as e:  # report every family, then fail
            failed += 1
            print(f"{fam:16s} FAILED on {device}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    n = len(sys.argv[1:] or [*FAMILIES, "host-tier"])
    print(f"engine vs HF on {device}: {n - failed} of {n} families equal", flush=True)
    sys.exit(1 if failed else 0)
