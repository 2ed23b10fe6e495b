"""``jenga plan --model A,B`` and ``jenga bench --model A,B``: the shared pool next to a static split."""

from __future__ import annotations

import json

import pytest

from jenga.cli import main
from jenga.core.manager.manager import KVCacheManager
from jenga.core.manager.multi_model import MultiModelManager
from jenga.core.specs import ModelSpec

MODELS = ("llama-3.1-8b", "gemma-3-12b")


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_plan_shared_pool_next_to_a_static_split(capsys):
    rc, out, _ = run_cli(capsys, "plan", "--model", ",".join(MODELS), "--memory", "12GiB", "--short-tokens", "2048",
                         "--max-model-len", "32768", "--json")
    assert rc == 0
    data = json.loads(out)
    specs = [ModelSpec.from_hf_config(m, dtype="bf16", name=m, vision=False) for m in MODELS]
    assert [m["model"] for m in data["models"]] == list(MODELS)
    assert sum(m["shared"]["floor_bytes"] for m in data["models"]) <= data["total_bytes"]
    for spec, m in zip(specs, data["models"], strict=True):
        static = KVCacheManager(spec, (12 << 30) // 2)
        assert m["static"]["pool_bytes"] == static.total_bytes
        assert m["shared"]["max_concurrent_requests"] > m["static"]["max_concurrent_requests"] > 0
    # the shared figure, checked by real allocations: that many 2048-token requests of llama fit
    # beside an idle gemma, one more does not (its floor stays reachable)
    mgr = MultiModelManager(specs, 12 << 30, max_model_lens=dict.fromkeys(MODELS, 32768))
    n = data["models"][0]["shared"]["max_concurrent_requests"]
    for i in range(n + 1):
        mgr.add_request(i, [3 + (i * 7 + j) % 1000 for j in range(2048)], model=MODELS[0])
        mgr.lookup(i)
        ok = mgr.allocate(i, 2048) is not None
        assert ok == (i < n), (i, n)
    mgr.check_integrity()


def test_plan_table_and_bad_lists(capsys):
    rc, out, _ = run_cli(capsys, "plan", "--model", ",".join(MODELS), "--memory", "40GiB")
    assert rc == 0 and "one shared pool: KV memory 40.00 GiB" in out and "static" in out
    rc, _, err = run_cli(capsys, "plan", "--model", "llama-3.1-8b,llama-3.1-8b", "--memory", "40GiB")
    assert rc == 2 and "named twice" in err
    rc, _, err = run_cli(capsys, "plan", "--model", ",".join(MODELS), "--memory", "12GiB")
    assert rc == 2 and "floors" in err  # two 128k-token floors do not fit 12 GiB


@pytest.mark.parametrize("scenario", ["skewed"])
def test_bench_runs_both_engines_on_the_same_work(capsys, scenario):
    rc, out, _ = run_cli(capsys, "bench", "--model", "tiny-llama,tiny-gemma3", "--kv-memory", "2MiB",
                         "--requests", "3", "--prompt-min", "20", "--prompt-max", "40", "--output-len", "3",
                         "--scenarios", scenario, "--json")
    assert rc == 0
    res = json.loads(out)["scenarios"][scenario]
    assert res["shared"]["output_tokens"] == res["static"]["output_tokens"] == 2 * 3 * 3
    assert res["ratio"]["tokens_per_s"] == pytest.approx(res["shared"]["tokens_per_s"] / res["static"]["tokens_per_s"])


def test_bench_repeats_keep_each_engines_fastest_run_and_refuse_differing_counts(monkeypatch):
    """``--repeats``: the engines alternate, each keeps its lowest CPU time, and a repeat whose counts
    differ from the first run's is an error (the clock may differ between repeats, the work may not)."""
    import argparse

    from jenga import multi_bench

    calls: list[str] = []
    cpu = {"shared": iter([3.0, 1.0, 2.0]), "static": iter([5.0, 6.0, 4.0])}

    def fake(kind, models, work, args, max_len):
        calls.append(kind)
        c = next(cpu[kind])
        return {"cpu_s": c, "output_tokens": 10, "forwards": 4, "preemptions": 0, "preemptions_by_model": {},
                "decode_batch_mean": 2.0}

    monkeypatch.setattr(multi_bench, "run_scenario", fake)
    best = multi_bench._fastest(["a", "b"], [], argparse.Namespace(repeats=3), 8)
    assert calls == ["shared", "static"] * 3
    assert (best["shared"]["cpu_s"], best["static"]["cpu_s"]) == (1.0, 4.0)

    def drifting(kind, models, work, args, max_len):
        drifting.n += 1
        return {"cpu_s": 1.0, "output_tokens": 10, "forwards": 4 + drifting.n // 3, "preemptions": 0,
                "preemptions_by_model": {}, "decode_batch_mean": 2.0}
    drifting.n = 0
    monkeypatch.setattr(multi_bench, "run_scenario", drifting)
    with pytest.raises(RuntimeError, match="served the same work differently"):
        multi_bench._fastest(["a", "b"], [], argparse.Namespace(repeats=2), 8)


def test_simulate_two_models_at_real_sizes(capsys):
    rc, out, _ = run_cli(capsys, "simulate", "--model", ",".join(MODELS), "--requests", "30", "--output-len", "8",
                         "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["gpu"] == "h100-80gb" and d["memory_bytes"] > 30 << 30  # 80 GB x 0.9 - both models' weights - reserve
    for res in d["scenarios"].values():
        for kind in ("shared", "static"):
            assert res[kind]["output_tokens"] == 2 * 30 * 8 and res[kind]["rejected"] == 0


def test_simulate_h200_pair_fits_in_fp8_weights_only(capsys):
    """Qwen3-Next-80B and Gemma-3-12B on one H200: in bf16 their weights (about 184 GB) exceed the
    GPU, so the start is refused; in fp8 they fit, with the KV budget what is left.  One scenario
    runs alone (``--scenarios``); the same scenario's rows as in a run of both."""
    pair = "qwen3-next-80b,gemma-3-12b"
    rc, _, err = run_cli(capsys, "simulate", "--model", pair, "--gpu", "h200-141gb", "--requests", "4")
    assert rc != 0 and "exceed" in err
    argv = ("simulate", "--model", pair, "--gpu", "h200-141gb", "--weight-dtype", "fp8", "--requests", "6",
            "--output-len", "4", "--json")
    rc, out, _ = run_cli(capsys, *argv, "--scenarios", "balanced")
    assert rc == 0
    one = json.loads(out)
    assert one["weight_dtype"] == "fp8" and list(one["scenarios"]) == ["balanced"]
    assert 30 << 30 < one["memory_bytes"] < 60 << 30
    rc, out, _ = run_cli(capsys, *argv)
    assert json.loads(out)["scenarios"]["balanced"] == one["scenarios"]["balanced"]
    rc, _, err = run_cli(capsys, *argv, "--scenarios", "spiky")
    assert rc != 0 and "unknown scenario" in err


def test_simulate_serves_a_pair_whose_lcm_page_needs_split_groups(capsys):
    """Qwen3-Next-80B's 37.69 MiB state pages beside Gemma-3-27B's pages: unsplit, no page plan keeps the
    LCM page within 8x the largest small page (refused before); with the groups split into power-of-two
    layer counts the pool is planned and both models are served."""
    rc, out, err = run_cli(capsys, "simulate", "--model", "qwen3-next-80b,gemma-3-27b", "--gpu", "h200-141gb",
                           "--weight-dtype", "fp8", "--requests", "4", "--output-len", "8", "--json")
    assert rc == 0, err
    for res in json.loads(out)["scenarios"].values():
        for kind in ("shared", "static"):
            assert res[kind]["output_tokens"] == 2 * 4 * 8 and res[kind]["rejected"] == 0
