"""State-space / linear-attention hybrids on jenga pages vs HF transformers (same fp32 weights).

For each tiny hybrid family: greedy tokens equal HF ``generate`` and every generated token's
logits agree to 1e-4 — for a single request, a batch of different lengths under chunked
prefill, a request resuming from a state checkpoint of an earlier prompt (the hit is asserted
and equals a cold run), and a KV budget so small that requests are preempted and cached pages
evicted (both asserted).  Plus: the state after any set of checkpoint positions inside a step
equals the state of scanning that prefix alone.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf

import jenga
from jenga import SamplingParams

#: tiny model -> a KV budget that forces preemption (a few of its large pages)
HYBRIDS = {"tiny-jamba": "400KiB", "tiny-nemotron-h": "1200KiB", "tiny-falcon-h1": "1200KiB",
           "tiny-qwen3-next": "300KiB", "tiny-bamba": "950KiB", "tiny-granite-4h": "950KiB",
           "tiny-granite-4h-dense": "950KiB", "tiny-nemotron-h-moe": "1200KiB"}
GREEDY = SamplingParams(max_tokens=5, return_logits=True)
_HF: dict = {}
torch.set_num_threads(1)


def hf_model(llm):
    """HF's own model class for the engine's config, with the engine's weights."""
    key = llm.config.to_json_string()  # two tiny Granite-4.0-H variants share a model type
    if key not in _HF:
        hf = tf.AutoModelForCausalLM.from_config(llm.config).eval()
        hf.load_state_dict(llm.model.state_dict())
        _HF[key] = hf
    return _HF[key]


def prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 512, (n,), generator=gen).tolist() for n in lengths]


def assert_hf_equal(llm, outs):
    hf = hf_model(llm)
    for out in outs:
        ids = torch.tensor([out.prompt_token_ids])
        with torch.no_grad():
            res = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(out.token_ids),
                              do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        assert out.token_ids == res.sequences[0, ids.shape[1]:].tolist(), f"request {out.request_id}: tokens differ"
        for got, ref in zip(out.logits, res.logits, strict=True):
            torch.testing.assert_close(got, ref[0].float(), atol=1e-4, rtol=1e-4)
            assert (got - ref[0]).abs().max() <= 1e-4 * ref[0].abs().max()  # also relative to the logits' scale


@pytest.mark.parametrize("name", HYBRIDS)
def test_single_and_chunked_batch_match_hf(name):
    llm = jenga.LLM(name, kv_memory="8MiB", max_num_batched_tokens=29, state_checkpoint_interval=32)
    single = llm.generate(prompts([23], seed=3), GREEDY)
    batch = llm.generate(prompts([75, 41, 20]), GREEDY)
    assert llm.scheduler.stats.steps >= 5 + 5 + 4  # the batch's 136 prompt tokens took 5 chunks of <= 29
    assert_hf_equal(llm, single + batch)


@pytest.mark.parametrize("name", HYBRIDS)
def test_checkpoint_hit_equals_cold_run(name):
    shared, a, b = prompts([100, 9, 13], seed=1)
    llm = jenga.LLM(name, kv_memory="8MiB", max_num_batched_tokens=40, state_checkpoint_interval=32)
    first = llm.generate([shared + a], GREEDY)
    second = llm.generate([shared + b], GREEDY)
    assert first[0].prefix_hit_tokens == 0
    assert second[0].prefix_hit_tokens == 96, "attention and state should both resume at the 96-token checkpoint"
    cold = jenga.LLM(name, kv_memory="8MiB", enable_prefix_caching=False).generate([shared + b], GREEDY)
    assert second[0].token_ids == cold[0].token_ids
    for got, ref in zip(second[0].logits, cold[0].logits, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    assert_hf_equal(llm, first + second)


@pytest.mark.parametrize("name", HYBRIDS)
def test_steps_ending_on_checkpoints_hand_the_work_page_on(name):
    """Prefill steps of 32 end on the checkpoints 32 and 64 (periodic, prompt end): each time the
    work page becomes the checkpoint and the next step copies it into a fresh work page; the
    hit's checkpoint is let go of once its step is allocated.  Tokens and logits equal HF's."""
    shared, b = prompts([64, 11], seed=5)
    llm = jenga.LLM(name, kv_memory="8MiB", max_num_batched_tokens=32, state_checkpoint_interval=32)
    first = llm.generate([shared], GREEDY)
    assert llm.manager.stats().cached_bytes > 0
    second = llm.generate([shared + b], GREEDY)
    assert second[0].prefix_hit_tokens == 64, "the state should resume at the prompt-end checkpoint 64"
    assert_hf_equal(llm, first + second)


@pytest.mark.parametrize("name", HYBRIDS)
def test_prefill_step_ends_on_the_prompt_end_checkpoint(name):
    """A 41-token prompt under a 64-token budget runs [0, 32) then [32, 41) (the scheduler's
    chunk split, ``jenga.core.manager.cache_control``): the first step's work page becomes the prompt-end
    checkpoint 32, which a later prompt resumes from.  Tokens and logits equal HF's."""
    shared, b = prompts([41, 7], seed=6)
    llm = jenga.LLM(name, kv_memory="8MiB", max_num_batched_tokens=64, state_checkpoint_interval=32)
    first = llm.generate([shared], GREEDY)
    assert llm.scheduler.stats.steps == 2 + 4  # two prefill steps (the second samples), four decodes
    second = llm.generate([shared + b], GREEDY)
    assert second[0].prefix_hit_tokens == 32, "the state should resume at the prompt-end checkpoint 32"
    assert_hf_equal(llm, first + second)


@pytest.mark.parametrize("name", HYBRIDS)
def test_recompute_under_shared_attention_pages_matches_hf(name):
    """The second request of an 85-token shared prefix: its state resumes at the checkpoint 64
    (none at the junction 80 yet), so tokens [64, 80) are recomputed for the state layers while
    the attention layers share the first request's cached pages up to 80 and write no K/V there
    (slot -1; ``jenga.core.manager.junction``).  The third resumes at 80.  Tokens and logits equal HF's."""
    shared, a, b, c = prompts([85, 25, 13, 9], seed=7)
    llm = jenga.LLM(name, kv_memory="8MiB", max_num_batched_tokens=64, state_checkpoint_interval=32)
    writes, backend = [], llm.runner.backend
    write_kv = backend.write_kv

    def spy(view, slots, k, v):
        writes.append(slots.clone())
        return write_kv(view, slots, k, v)

    backend.write_kv = spy
    first = llm.generate([shared + a], GREEDY)
    n_attn = len(writes) // llm.scheduler.stats.steps  # one write per attention layer and step
    writes.clear()
    second = llm.generate([shared + b], GREEDY)
    assert second[0].prefix_hit_tokens == 64, "the state should resume at the periodic checkpoint 64"
    # first step [64, 96): positions 64..79 (the first 16 rows) are in shared pages, not written
    assert all((w[:16] == -1).all() and (w[16:] >= 0).all() for w in writes[:n_attn])
    assert sum(int((w < 0).sum()) for w in writes) == 16 * n_attn
    third = llm.generate([shared + c], GREEDY)
    assert third[0].prefix_hit_tokens == 80, "the state should resume at the junction checkpoint 80"
    assert_hf_equal(llm, first + second + third)


@pytest.mark.parametrize("name", HYBRIDS)
def test_preemption_and_eviction_match_hf(name):
    llm = jenga.LLM(name, kv_memory=HYBRIDS[name], max_num_batched_tokens=64, state_checkpoint_interval=32)
    outs = llm.generate(prompts([90, 70, 80, 60], seed=4), SamplingParams(max_tokens=16, return_logits=True))
    assert llm.scheduler.stats.preemptions > 0
    assert llm.manager.stats().evicted_pages > 0
    assert any(o.num_preemptions for o in outs)
    assert_hf_equal(llm, outs)


def test_checkpoints_at_any_positions_equal_prefix_scans():
    """Checkpoints at arbitrary positions inside one prefill step (not multiples of anything)."""
    from jenga.engine.state import StateContext, StateMetadata

    llm = jenga.LLM("tiny-jamba", kv_memory="2MiB")
    mixer = llm.model.model.layers[0].mamba
    views = llm.runner.states.views[0]
    u = torch.randn(40, mixer.in_proj.out_features, generator=torch.Generator().manual_seed(0))
    cuts = {5: 3, 17: 4, 18: 5, 40: 6}  # tokens done -> exec page
    meta = StateMetadata([2], [True], [(0, 40)], [sorted(cuts.items())])
    ctx = StateContext([], [], state_views=[views], state_metadata=[meta])
    with torch.inference_mode():
        y = ctx.run_state(0, u, mixer)
        zero = tuple(torch.zeros(s) for s in mixer.state_shapes())
        ref_y, _ = mixer.state_scan(u, zero)
        torch.testing.assert_close(y, ref_y, atol=1e-5, rtol=1e-5)
        for t, page in cuts.items():
            _, want = mixer.state_scan(u[:t], zero)
            for view, w in zip(views, want, strict=True):
                torch.testing.assert_close(view[page], w, atol=1e-5, rtol=1e-5)
        for view, w in zip(views, want, strict=True):  # the work page holds the state after all 40
            torch.testing.assert_close(view[2], w, atol=1e-5, rtol=1e-5)
