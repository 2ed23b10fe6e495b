"""Simulator invariants: every request ends, memory sums to the total, jenga never wastes more
than paged, seeded determinism, rejection, speculative decoding, images, closed forms."""

from __future__ import annotations

import pytest

from jenga.sim.reproduce import closed_form, mllama_waste, swa_waste
from jenga.sim.setup import build_setup
from jenga.sim.simulator import SimConfig, Simulator
from jenga.sim.workloads import SimRequest, Workload, WorkloadInfo, get_workload

GiB = 1 << 30


def _trace(n: int = 10, seed: int = 0, long: int = 2000) -> Workload:
    """Prompts past gemma-3's 1024-token window; arrivals spread so queues form and drain."""
    reqs = [SimRequest(f"r{i}", 0.05 * i, 1500 + (i * 377 + seed * 91) % long, 20 + i % 7) for i in range(n)]
    return Workload(reqs, WorkloadInfo("test", seed))


@pytest.fixture(scope="module")
def gemma():
    return build_setup("gemma-3-12b", memory_bytes=2 * GiB)


@pytest.fixture(scope="module")
def runs(gemma):
    sim = Simulator(gemma, SimConfig(max_num_batched_tokens=2048, check_integrity=True))
    w = _trace()
    return w, {m: sim.run(w, m) for m in ("jenga", "paged")}


def test_every_request_finishes(runs):
    w, res = runs
    for r in res.values():
        assert r.finished == len(w) and not r.rejected
        assert r.output_tokens == sum(q.output_len for q in w)
        assert len(r.latencies_s) == len(w) and (r.latencies_s >= r.ttfts_s).all() and (r.ttfts_s > 0).all()


def test_memory_sums_to_total_every_step(runs):
    _, res = runs
    for r in res.values():
        assert len(r.timeline) == r.steps
        for rec in r.timeline:
            assert rec.used_bytes + rec.cached_bytes + rec.free_bytes == rec.total_bytes
            assert 0.0 <= rec.waste_frac <= 1.0


def test_jenga_waste_not_above_paged(runs):
    _, res = runs
    j, p = res["jenga"].summary(), res["paged"].summary()
    assert j["waste_frac_mean"] <= p["waste_frac_mean"]
    assert p["waste_frac_mean"] > 0.3  # paged keeps out-of-window tokens of 40 sliding layers
    assert j["max_concurrent"] >= p["max_concurrent"]


def test_summary_keys(runs):
    _, res = runs
    s = res["jenga"].summary()
    for key in ("throughput_req_s", "throughput_tok_s", "latency_mean_s", "latency_p99_s", "ttft_mean_s",
                "ttft_p99_s", "decode_batch_mean", "waste_frac_mean", "prefix_hit_rate", "preemptions", "steps",
                "max_concurrent"):
        assert key in s
    assert s["throughput_req_s"] > 0 and s["decode_batch_mean"] >= 1


def test_deterministic_by_seed(gemma):
    sim = Simulator(gemma, SimConfig(max_num_batched_tokens=2048, seed=3))
    a, b = (sim.run(_trace(6, seed=1), "jenga").summary() for _ in range(2))
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b
    c = Simulator(gemma, SimConfig(max_num_batched_tokens=2048, seed=3)).run(_trace(6, seed=2), "jenga").summary()
    assert c["makespan_s"] != a["makespan_s"]


def test_preemption_under_pressure_still_finishes(gemma):
    sim = Simulator(gemma, SimConfig(max_num_batched_tokens=4096))
    reqs = [SimRequest(f"p{i}", 0.0, 3000, 120) for i in range(8)]
    r = sim.run(Workload(reqs, WorkloadInfo("pressure")), "paged")
    assert r.finished == 8 and r.preemptions > 0


def test_never_fitting_requests_are_rejected(gemma):
    sim = Simulator(gemma, SimConfig(max_num_batched_tokens=2048))
    reqs = [SimRequest("ok", 0.0, 2000, 10), SimRequest("huge", 0.0, 30000, 10),
            SimRequest("toolong", 0.0, 131000, 500), SimRequest("ok2", 0.1, 1000, 10)]
    for m in ("jenga", "paged"):
        r = sim.run(Workload(reqs, WorkloadInfo("reject")), m)
        assert r.finished == 2
        assert set(r.rejected) == {"huge", "toolong"}
        assert "max length" in r.rejected["toolong"]


def test_prefix_caching_hits_shared_articles():
    st = build_setup("ministral-8b", memory_bytes=4 * GiB)
    w = get_workload("arxiv-multiq", num_articles=2, questions_per_article=2, max_len=8192, seed=0)
    r = Simulator(st, SimConfig(max_num_batched_tokens=4096)).run(w, "jenga")
    assert r.finished == 4 and r.prefix_hit_rate > 0.3


def test_speculative_decoding_with_heterogeneous_draft():
    st = build_setup("ministral-8b", draft="llama-3.2-1b", memory_bytes=2 * GiB)
    assert len(st.model.groups) > len(st.target.groups)
    w = get_workload("spec-decode", num_requests=6, max_len=8192, seed=0)
    sim = Simulator(st, SimConfig())
    spec = sim.run(w, "jenga")
    plain = sim.run(w, "jenga", num_spec_tokens=0)
    assert spec.finished == plain.finished == 6
    assert spec.output_tokens == plain.output_tokens == sum(q.output_len for q in w)
    assert spec.steps < plain.steps  # ~2.5 tokens per verify step at acceptance 0.7, k=3


def test_images_cross_attention_model():
    st = build_setup("llama-3.2-11b-vision", memory_bytes=2 * GiB)
    w = get_workload("mmmu-pro", num_requests=4, seed=0)
    res = {m: Simulator(st, SimConfig()).run(w, m).summary() for m in ("jenga", "paged")}
    assert res["jenga"]["finished"] == res["paged"]["finished"] == 4
    assert res["jenga"]["waste_frac_mean"] <= res["paged"]["waste_frac_mean"]


def test_cross_attention_images_are_encoder_tokens_not_decoder_positions():
    """Llama 3.2 Vision's self-attention layers never see the image tokens (they are the encoder's,
    read through the cross-attention layers): one mmmu-pro request makes the scheduler prefill its
    text and one image token, and jenga's pages hold the text in the self-attention group and the
    image in the cross group; paged (vLLM v0) holds both sequences in every layer.  The step's
    cost still runs the tower over the whole image."""
    st = build_setup("llama-3.2-11b-vision", memory_bytes=4 * GiB)
    w = get_workload("mmmu-pro", num_requests=1, seed=55555)
    (_, n, _), = w[0].images
    text = w[0].prompt_len - n
    cfg = SimConfig(enable_prefix_caching=False, record_every=1, scheduler="v0", record_terms=True)
    per_token = {g.kind: g.page_bytes // g.tokens_per_page for g in st.model.groups}
    res = {m: Simulator(st, cfg).run(w, m) for m in ("jenga", "paged")}
    for r in res.values():
        assert r.prefill_tokens == text + 1  # the decoder's prompt: text + one <|image|> token
    held = res["jenga"].timeline[0].used_bytes
    assert held < 1.05 * (n * per_token["cross"] + (text + 1 + 64) * per_token["full"])
    assert res["paged"].timeline[0].used_bytes >= (n + text + 1) * (per_token["full"] + per_token["cross"])
    assert res["jenga"].step_terms[0][2] == res["paged"].step_terms[0][2] > 0  # the tower's FLOPs


def test_decoder_view_maps_decoder_ranges_to_trace_ranges():
    import numpy as np

    from jenga.sim.decoder_view import decoder_view

    ids = np.arange(100)
    v = decoder_view(ids, ((5, 20, "a"), (40, 10, "b")), cross_attention=True)
    assert v.images == ((5, 20, "a"), (21, 10, "b")) and len(v.ids) == 100 - 19 - 9
    assert v.ids[5] == 5 and v.ids[21] == 40  # each image keeps its first token
    assert [v.expanded(p) for p in (0, 5, 6, 21, 22, len(v.ids))] == [0, 5, 25, 40, 50, 100]
    same = decoder_view(ids, ((5, 20, "a"),), cross_attention=False)
    assert same.ids is ids and same.images == ((5, 20, "a"),) and same.expanded(30) == 30


def test_closed_form_numbers_pinned():
    assert f"{100 * mllama_waste():.1f}" == "79.6"
    assert f"{100 * swa_waste('gemma-2-9b'):.0f}" == "25"
    assert f"{100 * swa_waste('ministral-8b'):.2f}" == "56.25"
    rows = {r.what: r for r in closed_form()}
    assert all(r.ours == r.paper for r in rows.values()), rows


def test_host_tier_copies_priced_on_the_host_link():
    """8 documents of 1,000 tokens asked twice, round robin, on a pool of about three: the host tier turns the
    second round's misses into promotions, each step's copies cost bytes / 55 GB/s (H100's PCIe
    Gen5 host link), and copying the hits back is cheaper than prefilling them again."""
    setup = build_setup("llama-3.1-8b", memory_bytes=3 * 1096 * (128 << 10))  # 128 KiB per token
    w = Workload([SimRequest(f"q{i}", 0.5 * i, 1050, 8, prefix_id=f"doc{i % 8}", prefix_len=1000) for i in range(16)],
                 WorkloadInfo("articles", 0))
    cfg = dict(max_num_batched_tokens=2048, max_num_seqs=4, check_integrity=True)
    base = Simulator(setup, SimConfig(**cfg)).run(w, "jenga")
    tier = Simulator(setup, SimConfig(host_memory_bytes=4 * setup.memory_bytes, **cfg)).run(w, "jenga")
    h = tier.host
    assert base.host is None and "host_copy_s" not in base.summary()
    assert h.bytes_demoted > 0 and h.bytes_promoted > 0 and h.host_hit_tokens > 0
    assert h.copy_s == pytest.approx((h.bytes_demoted + h.bytes_promoted) / 55e9)
    assert 0 < h.host_peak_used_bytes <= h.host_total_bytes <= 4 * setup.memory_bytes
    assert tier.prefix_hit_rate > base.prefix_hit_rate and tier.prefill_tokens < base.prefill_tokens
    assert h.recompute_s > h.bytes_promoted / 55e9
    assert tier.makespan_s < base.makespan_s  # the copies cost less than the prefills they save
    assert tier.summary()["host_hit_tokens"] == h.host_hit_tokens and tier.finished == base.finished == len(w)


def test_step_clock_prices_steps_and_copies():
    """The clock a benchmark's own loop uses: a step costs the simulator's step time, plus its plan's
    copies on the host link."""
    import numpy as np

    from jenga.core.tier.copy_plan import CopyPlan
    from jenga.sim.step_clock import StepClock

    setup = build_setup("llama-3.1-8b", memory_bytes=GiB)
    clock = StepClock(setup, setup.model)
    clock.computed(1000, 1000)  # a prefill chunk
    clock.computed(50, 1)  # a decode
    kv, flops = setup.coster.step(np.array([1000, 50]), np.array([1000, 1]), np.zeros(2, np.int64))
    want = setup.cost.step_time(1000, 1, kv, attention_flops=flops, num_seqs=2)
    assert clock.step_done() == pytest.approx(want)
    plan = CopyPlan(demote={0: np.array([[3, 4]])}, promote={0: np.array([[4, 5], [6, 7]])})
    page = setup.model.groups[0].page_bytes
    assert clock.step_done(plan) == pytest.approx(3 * page / 55e9)  # copies only
    assert clock.steps == 1 and clock.seconds == pytest.approx(want + 3 * page / 55e9)
    assert clock.copies.bytes_promoted == 2 * page and clock.copies.bytes_demoted == page
