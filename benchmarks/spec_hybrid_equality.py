"""Speculative decoding on state hybrids: requests whose greedy tokens equal the target alone's.

Per hybrid family (Gated DeltaNet, Mamba-1, Mamba-2), jenga's engine with a draft against the
same target without one: 32 prompts sharing four prefixes, ``max_tokens=12``, greedy, 64 MiB, fp32
on the CPU.  Two drafts: the family's own architecture with random weights seeded 1 (the setup of
the report this fixes: it almost never agrees with the target) and the target's weights plus
N(0, ``--noise``) noise (kept some of the time).  Columns: requests equal to the target alone with
prefix caching on and off, the acceptance rate, and requests equal between caching on and off.

Usage: ``python benchmarks/spec_hybrid_equality.py [--k 3] [--families tiny-jamba,...]``
"""

from __future__ import annotations

import argparse

FAMILIES = ["tiny-qwen3-next", "tiny-jamba", "tiny-falcon-h1", "tiny-bamba", "tiny-nemotron-h", "tiny-granite-4h"]


def prompts(n: int = 32, seed: int = 0) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    pre = [torch.randint(3, 500, (m,), generator=gen).tolist() for m in (40, 23, 57, 16)]
    return [pre[i % 4] + torch.randint(3, 500, (1 + (i * 7) % 13,), generator=gen).tolist() for i in range(n)]


def run(model: str, ps, params, *, k: int = 0, caching: bool = True, draft_seed: int = 1, noise: float = 0.0):
    import torch

    import jenga

    spec = dict(speculative_model=model, num_speculative_tokens=k, speculative_seed=draft_seed) if k else {}
    llm = jenga.LLM(model, random_weights=True, seed=0, kv_memory="64MiB", enable_prefix_caching=caching, **spec)
    if noise:
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in llm.speculative.draft.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * noise)
    return [o.token_ids for o in llm.generate(ps, params)], llm.metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--noise", type=float, default=0.003)
    ap.add_argument("--families", default=",".join(FAMILIES))
    args = ap.parse_args()
    import torch

    from jenga import SamplingParams

    torch.set_num_threads(1)
    ps, params = prompts(), SamplingParams(max_tokens=12, temperature=0)
    print(f"k = {args.k}, {len(ps)} requests, max_tokens 12, greedy, 64 MiB")
    print("| model | draft | equal to the target alone, caching on | caching off | acceptance | caching on = off |")
    print("|---|---|---|---|---|---|")
    bad = 0
    for model in args.families.split(","):
        want, _ = run(model, ps, params)
        for label, draft in (("random (seed 1)", dict(draft_seed=1)),
                             (f"target + N(0, {args.noise})", dict(draft_seed=0, noise=args.noise))):
            on, m = run(model, ps, params, k=args.k, caching=True, **draft)
            off, _ = run(model, ps, params, k=args.k, caching=False, **draft)
            eq_on, eq_off, same = (sum(a == b for a, b in zip(x, y, strict=True))
                                   for x, y in ((on, want), (off, want), (on, off)))
            bad += (eq_on < len(ps)) + (eq_off < len(ps))
            print(f"| {model} | {label} | {eq_on}/{len(ps)} | {eq_off}/{len(ps)} | {m.acceptance_rate:.2f} | "
                  f"{same}/{len(ps)} |", flush=True)
    if bad:
        raise SystemExit(f"{bad} runs differ from the target alone")


if __name__ == "__main__":
    main()
