"""The artifact's figure-14 workloads and the v0 (no chunked prefill) scheduler mode."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from jenga.core.manager.manager import KVCacheManager
from jenga.core.specs import ModelSpec
from jenga.errors import InvalidArgumentError
from jenga.sched.sampling_params import SamplingParams
from jenga.sched.scheduler import Scheduler
from jenga.sched.sequence import Sequence
from jenga.sched.v0_scheduler import V0Scheduler, v0_token_budget
from jenga.sim.artifact_workloads import ARXIV_GROUP_SIZES, MMLU_SUBJECTS
from jenga.sim.setup import build_setup
from jenga.sim.simulator import SimConfig, Simulator
from jenga.sim.workloads import get_workload

GiB = 1 << 30


# ------------------------------------------------------------------------------- arxiv-multiq

def test_arxiv_multiq_cap_keeps_whole_papers_under_the_cap():
    capped = get_workload("arxiv-multiq", num_articles=8, questions_per_article=4, max_prompt_len=80000, seed=3)
    free = get_workload("arxiv-multiq", num_articles=8, questions_per_article=4, seed=3)
    assert len(capped) == 32
    assert max(r.prompt_len + r.output_len for r in capped) <= 80000
    by_doc = {r.prefix_id: r.prefix_len for r in capped}
    free_doc = {r.prefix_id: r.prefix_len for r in free}
    assert all(by_doc[d] <= free_doc[d] for d in by_doc)  # a prefix of the same papers
    assert any(by_doc[d] < free_doc[d] for d in by_doc)  # the cap bit somewhere
    assert {r.output_len for r in capped} == {150}


def test_arxiv_multiq_shuffled_is_pythons_seeded_shuffle_of_the_grouped_list():
    w = get_workload("arxiv-multiq", num_articles=8, questions_per_article=4, order="shuffled", seed=55555)
    expect = sorted(np.arange(32) % 8, key=int)
    random.Random(55555).shuffle(expect)
    assert [r.prefix_id for r in w] == [f"article-{a}" for a in expect]
    assert [r.arrival_s for r in w] == [0.0] * 32
    inter = get_workload("arxiv-multiq", num_articles=8, questions_per_article=4, order="interleaved", seed=55555)
    assert [r.prefix_id for r in inter[:8]] == [f"article-{a}" for a in range(8)]
    assert len(ARXIV_GROUP_SIZES) == 61 and ARXIV_GROUP_SIZES[:3] == (9, 5, 7)
    with pytest.raises(ValueError, match="max_prompt_len"):
        get_workload("arxiv-multiq", max_prompt_len=100)


# ----------------------------------------------------------------------------- mmlu-pro-5shot

def test_mmlu_pro_5shot_subjects_share_prefixes():
    w = get_workload("mmlu-pro-5shot", num_requests=5000, seed=0)
    p = np.array([r.prompt_len for r in w])
    assert 1150 < p.mean() < 1400 and p.max() <= 3076
    subjects = {r.prefix_id for r in w}
    assert len(subjects) == len(MMLU_SUBJECTS) == 14
    lens = {}
    for r in w:
        lens.setdefault(r.prefix_id, set()).add(r.prefix_len)
        assert 0 < r.prefix_len < r.prompt_len
    assert all(len(v) == 1 for v in lens.values())
    assert {r.output_len for r in w} == {20}
    assert len(get_workload("mmlu-pro-5shot")) == 1000


# ---------------------------------------------------------------------------------- v0 scheduler

def _seq(i: int, n: int, out: int = 4) -> Sequence:
    return Sequence(f"r{i}", list(range(16 + i * 7919 % 997, 16 + i * 7919 % 997 + n)),
                    SamplingParams(max_tokens=out, ignore_eos=True))


@pytest.fixture()
def small_mgr():
    spec = ModelSpec.from_hf_config("llama-3.1-8b")
    per_tok = sum(g.num_layers * g.spec.bytes_per_token() for g in spec.groups)
    return lambda tokens: KVCacheManager(spec, per_tok * tokens, enable_prefix_caching=False)


def test_v0_admits_whole_prompts_in_prefill_only_steps(small_mgr):
    mgr = small_mgr(2600)  # two 1000-token prompts fit, a third does not
    s = V0Scheduler(mgr)
    assert s.budget == v0_token_budget(mgr.model.max_model_len) == max(mgr.model.max_model_len, 2048)
    assert s.max_num_seqs == 256
    for i in range(3):
        s.add(_seq(i, 1000))
    plan = s.schedule()
    assert [(it.seq.request_id, it.num_tokens) for it in plan.scheduled] == [("r0", 1000), ("r1", 1000)]
    s.update(plan, [7, 7])
    plan = s.schedule()  # r2 does not fit whole: a decode step of r0, r1 only
    assert [(it.seq.request_id, it.num_tokens) for it in plan.scheduled] == [("r0", 1), ("r1", 1)]
    assert len(s.waiting) == 1 and not s.waiting[0].in_manager
    s.update(plan, [7, 7])
    s.add(_seq(3, 100))
    plan = s.schedule()  # r2 still waits (FCFS head), nothing is admitted behind it
    assert all(it.num_tokens == 1 for it in plan.scheduled)
    # the chunked (v1-like) scheduler instead admits r2's first chunk into what is left
    c = Scheduler(small_mgr(2600), max_num_batched_tokens=2400)
    for i in range(3):
        c.add(_seq(i, 1000))
    assert [it.num_tokens for it in c.schedule().scheduled] == [1000, 1000, 400]


def test_v0_prefill_step_stalls_decodes_and_respects_budget(small_mgr):
    s = V0Scheduler(small_mgr(100000), max_num_batched_tokens=2500, max_num_seqs=3)
    s.add(_seq(0, 1000))
    s.update(s.schedule(), [7])
    for i in (1, 2, 3):
        s.add(_seq(i, 1000))
    plan = s.schedule()  # prefill only: r1, r2 (2000 tokens; r3 would pass 2500); r0 does not decode
    assert [it.seq.request_id for it in plan.scheduled] == ["r1", "r2"]
    s.update(plan, [7, 7])
    plan = s.schedule()  # max_num_seqs 3 reached: decode all three
    assert [(it.seq.request_id, it.num_tokens) for it in plan.scheduled] == [("r0", 1), ("r1", 1), ("r2", 1)]
    with pytest.raises(InvalidArgumentError, match="max_num_batched_tokens"):
        s.add(_seq(9, 3000))


def test_v0_mode_in_the_simulator():
    st = build_setup("ministral-8b", memory_bytes=3 * GiB)
    w = get_workload("arxiv-multiq", num_articles=2, questions_per_article=2, max_len=16384, seed=0)
    res = {}
    for kind in ("v0", "chunked"):
        cfg = SimConfig(scheduler=kind, max_num_batched_tokens=None if kind == "v0" else 2048)
        res[kind] = Simulator(st, cfg).run(w, "paged")
        assert res[kind].finished == 4
    assert res["v0"].steps < res["chunked"].steps  # whole prompts in one step each
    with pytest.raises(InvalidArgumentError, match="scheduler"):
        Simulator(st, SimConfig(scheduler="v2")).run(w, "paged")


# ------------------------------------------------------------------------------ cost-model fix

def test_mllama_image_positions_cost_the_tower_not_the_language_model():
    st = build_setup("llama-3.2-11b-vision")
    m = st.cost.model_info
    assert not m.images_in_lm
    assert m.cross_kv_params == 8 * 2 * 4096 * 8 * 128  # 8 cross layers' k_proj + v_proj
    assert 0.8e9 < m.vision_params < 1.0e9  # ViT-H/14 (32 + 8 layers) + projector
    text, image = 43, 6404
    as_images = st.cost.step_time(text + image, 0, num_image_tokens=image, num_seqs=1)
    as_text = st.cost.step_time(text + image, 0, num_seqs=1)
    c, g = st.cost, st.cost.gpu
    compute = (m.matmul_flops(text, 1) + m.image_flops(image)) / (g.peak_flops() * c.mfu)
    memory = m.weight_bytes_read(text, image) / (g.hbm_bytes_per_s * c.bandwidth_efficiency)
    assert as_images == pytest.approx(max(compute, memory) + c.step_overhead_s + c.per_seq_overhead_s)
    assert as_images < as_text / 5
    # self-attention layers read text positions only; cross layers read the image
    end, q = np.array([text + image]), np.array([text + image])
    kv_img, fl_img = st.coster.step(end, q, np.array([image]), np.array([image]), np.array([image]))
    kv_all, fl_all = st.coster.step(end, q, np.array([image]))
    self_b = sum(g.bytes_per_token for g in st.coster.groups if g.kind != "cross")
    cross_b = sum(g.bytes_per_token for g in st.coster.groups if g.kind == "cross")
    assert kv_img == self_b * text + cross_b * image
    assert kv_all == self_b * (text + image) + cross_b * image and fl_img < fl_all / 10
    with pytest.raises(ValueError, match="num_image_tokens"):
        st.cost.step_time(10, 0, num_image_tokens=11)


def test_vision_weights_are_read_only_by_steps_with_images():
    scout = build_setup("llama-4-scout", tp=8).cost.model_info
    assert scout.images_in_lm and scout.vision_params > 0
    bpp = 2
    assert scout.weight_bytes_read(1, 16) - scout.weight_bytes_read(1) == pytest.approx(bpp * scout.vision_params)
    llama = build_setup("llama-3.1-8b").cost.model_info
    assert llama.weight_bytes_read(1) == llama.weight_bytes_read(1, 5) == llama.weight_bytes


# ------------------------------------------------------------------- figure-14 settings, reserve

def test_profile_reserve_grows_with_the_v0_token_budget():
    from jenga.sim.activation import activation_bytes_per_token, profile_reserve_bytes
    from jenga.sim.gpu import DEFAULT_ACTIVATION_RESERVE_BYTES

    cfg = build_setup("ministral-8b", memory_bytes=1).target.hf_config
    assert profile_reserve_bytes(cfg, 8192) == DEFAULT_ACTIVATION_RESERVE_BYTES
    per_tok = activation_bytes_per_token(cfg)
    assert per_tok == 2 * ((32 + 2 * 8) * 128 + 3 * 12288 + 2 * 4096)  # qkv + gate/up/act + residual
    assert profile_reserve_bytes(cfg, 131072) == int(DEFAULT_ACTIVATION_RESERVE_BYTES + (131072 - 8192) * per_tok)
    assert activation_bytes_per_token(cfg, tp=4) < per_tok / 2


def test_figure14_cases_follow_the_artifact():
    from jenga.sim.figure14 import CASES, paper_ratio

    by = {c.label: c for c in CASES}
    assert set(by) == {"mllama", "Gemma-3", "Ministral", "Llama 4", "Jamba", "Llama 3.1"}
    assert [c.engine for c in CASES] == ["v0", "v1", "v0", "v1", "v0", "v1"]
    assert by["mllama"].max_num_seqs == 52 and by["mllama"].budget == 131072
    assert by["Jamba"].baseline == "static" and by["Jamba"].budget == 8192 and by["Jamba"].max_num_seqs == 1024
    assert by["Jamba"].prefix_caching == (False, False) and by["Jamba"].tp == 4
    assert all(c.budget == 8192 and c.max_num_seqs == 1024 for c in CASES if c.engine == "v1")
    assert by["Llama 4"].tp == 8 and by["Llama 4"].workload_kw["num_articles"] == 40
    assert by["Ministral"].workload_kw["max_prompt_len"] == 80000 and by["Gemma-3"].workload_kw["num_articles"] == 10
    ratios = [paper_ratio(c, "h100-80gb") for c in CASES]
    assert math.exp(sum(map(math.log, ratios)) / 6) == pytest.approx(1.43, abs=0.01)
    assert paper_ratio(by["Ministral"], "l4-24gb") is None  # the paper's baseline OOMed


def test_simulate_cli_takes_the_artifact_workload_options(capsys):
    import json

    from jenga.cli import main

    args = ["simulate", "--model", "ministral-8b", "--workload", "arxiv-multiq", "--articles", "2",
            "--questions-per-article", "2", "--order", "shuffled", "--max-prompt-len", "6000", "--seed", "55555",
            "--scheduler", "v0", "--manager", "paged,jenga", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["requests"] == 4 and all(m["finished"] == 4 for m in data["managers"].values())
    assert main(["simulate", "--workload", "mmlu-pro", "--articles", "2", "--json"]) == 2
    assert "num_articles" in capsys.readouterr().err


def test_reusable_prefix_share_counts_every_request_but_the_first_of_its_prefix():
    from jenga.sim.artifact_workloads import arxiv_multiq, reusable_prefix_share

    w = arxiv_multiq(num_articles=2, questions_per_article=3, order="grouped", seed=0, max_prompt_len=20000)
    p = {r.prefix_id: r.prefix_len for r in w}
    assert len(p) == 2 and all(v > 1024 for v in p.values())
    total = sum(r.prompt_len for r in w)
    assert reusable_prefix_share(w) == 2 * sum(p.values()) / total  # 2 of each document's 3 questions reuse it
    assert reusable_prefix_share(w, 1024) == 2 * sum(v // 1024 * 1024 for v in p.values()) / total
    assert reusable_prefix_share(w[:1]) == 0.0
