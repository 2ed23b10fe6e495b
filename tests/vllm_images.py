"""Shared by the vLLM image-prompt tests (Idefics3, Gemma-3): pictures, word prompts, phases of
requests run one after another with per-phase tokens, prefix hits and encoder runs."""

from __future__ import annotations

import numpy as np
from vllm_support import scheduler


def pictures(n: int, size: int):
    """``n`` seeded random RGB pictures of ``size`` x ``size`` pixels."""
    from PIL import Image

    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)) for _ in range(n)]


def words(rng, n: int) -> str:
    """``n`` random words of the tests' word-level tokenizers (``w8`` .. ``w499``): one token each."""
    return " ".join(f"w{rng.integers(8, 500)}" for _ in range(n))


def run_phases(llm, phases, names, *, max_tokens: int, pressure_tokens: int):
    """Greedy tokens and ``num_cached_tokens`` per request of each phase of ``phases`` (name, list
    of (text, picture)) whose name is in ``names``, and the number of images vLLM's scheduler sent
    to the encoder.  The phase ``pressure`` generates ``pressure_tokens`` tokens, the others
    ``max_tokens``."""
    from vllm import SamplingParams

    sched = scheduler(llm)
    encoded = []
    schedule = sched.schedule

    def counting(*args, **kw):  # vLLM's scheduler output names each image it sends to the encoder
        out = schedule(*args, **kw)
        encoded.append(sum(len(v) for v in out.scheduled_encoder_inputs.values()))
        return out

    sched.schedule = counting
    got = {}
    for name, prompts in phases:
        if name not in names:
            continue
        sp = SamplingParams(temperature=0, max_tokens=pressure_tokens if name == "pressure" else max_tokens,
                            ignore_eos=True)
        before = len(encoded)
        outs = llm.generate([{"prompt": t, "multi_modal_data": {"image": im}} for t, im in prompts], sp,
                            use_tqdm=False)
        got[name] = dict(tokens=[list(o.outputs[0].token_ids) for o in outs],
                         cached=[o.num_cached_tokens for o in outs], prompt_len=[len(o.prompt_token_ids) for o in outs],
                         encoded=sum(encoded[before:]))
    return got


def print_figures(ref: dict, got: dict) -> None:
    """The figures of a test's closing note (``pytest -s``): per phase, prompt tokens, prefix-hit
    tokens and images encoded, stock vLLM / jenga."""
    print(f"\n{'phase':<20}{'prompt':>7}{'hit stock':>11}{'hit jenga':>11}{'encoded stock':>15}{'encoded jenga':>15}")
    for name in got:
        print(f"{name:<20}{sum(got[name]['prompt_len']):>7}{sum(ref[name]['cached']):>11}"
              f"{sum(got[name]['cached']):>11}{ref[name]['encoded']:>15}{got[name]['encoded']:>15}")
