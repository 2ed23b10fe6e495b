"""Positive control of the engine's page tests: one page's bytes, corrupted between two steps,
change a random tiny model's greedy tokens (or logits).  Without it, "caching on equals caching
off" could also hold for an engine that never reads its pages back.  Per family: full attention
(tiny Llama), sliding + full (tiny Gemma-3), Mamba checkpoints beside attention (tiny Jamba)."""

from __future__ import annotations

import pytest
import torch

import jenga

torch.set_num_threads(1)
PROMPT = {"prompt_token_ids": [(7 * i) % 500 + 3 for i in range(40)]}
PARAMS = jenga.SamplingParams(max_tokens=6, temperature=0, return_logits=True)


def run(model: str, corrupt: int | None):
    """Greedy tokens and logits; ``corrupt``: group whose first page of the request gets noise
    (every fp32 value of it shifted by N(0, 1)) after the prefill step."""
    llm = jenga.LLM(model, random_weights=True, seed=0, kv_memory="4MiB")
    seq = llm.add_request(PROMPT, PARAMS, request_id="r")
    llm.step()  # the prefill: the prompt's K/V (states) are in the pages now
    if corrupt is not None:
        mgr = llm.manager
        page = mgr.requests["r"].groups[corrupt].pages[0]
        pb = mgr.model.groups[corrupt].page_bytes
        buf = mgr.layout.buffer
        values = buf.view(torch.uint8)[page * pb:(page + 1) * pb].view(torch.float32)
        values.add_(torch.randn(values.shape, generator=torch.Generator().manual_seed(1)).to(buf.device))
    while llm.has_unfinished:
        llm.step()
    return seq.output_token_ids, torch.stack(seq.logits)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gemma3"])
def test_a_corrupted_page_changes_the_output(model):
    tokens, logits = run(model, None)
    again, same = run(model, None)
    assert again == tokens and torch.equal(same, logits)  # the control itself is deterministic
    _, bad = run(model, 0)
    assert bad.isfinite().all() and (bad - logits).abs().max() > 1e-2, "a corrupted page changed nothing"
