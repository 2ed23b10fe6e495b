"""``jenga simulate`` / ``jenga reproduce`` through :func:`jenga.cli.main`."""

from __future__ import annotations

import json

from jenga.cli import main

KEYS = {"throughput_req_s", "throughput_tok_s", "latency_mean_s", "ttft_mean_s", "decode_batch_mean",
        "waste_frac_mean", "prefix_hit_rate", "preemptions", "latency_p99_s", "ttft_p99_s", "steps",
        "max_concurrent"}


def test_simulate_json_keys_and_plot(capsys, tmp_path):
    png = tmp_path / "tl.png"
    rc = main(["simulate", "--model", "gemma-3-12b", "--workload", "mmlu-pro", "--requests", "12",
               "--manager", "jenga,paged", "--seed", "1", "--json", "--plot", str(png)])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["managers"]) == {"jenga", "paged"}
    for summary in data["managers"].values():
        assert KEYS <= set(summary)
        assert summary["finished"] == 12
    assert data["model"] == "gemma-3-12b" and data["requests"] == 12
    assert png.stat().st_size > 10_000


def test_simulate_unknown_manager_is_skipped(capsys):
    rc = main(["simulate", "--model", "gemma-3-12b", "--workload", "mmlu-pro", "--requests", "4",
               "--manager", "jenga,nosuch", "--json"])
    out = capsys.readouterr()
    assert rc == 0
    data = json.loads(out.out)
    assert list(data["managers"]) == ["jenga"] and "nosuch" in data["unavailable"]
    assert "not available" in out.err


def test_simulate_table(capsys):
    assert main(["simulate", "--model", "gemma-3-12b", "--workload", "mmlu-pro", "--requests", "4",
                 "--manager", "jenga,paged"]) == 0
    out = capsys.readouterr().out
    assert "jenga" in out and "paged" in out and "req/s" in out


def test_reproduce_quick_json(capsys):
    assert main(["reproduce", "--quick", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["quick"] and "smoke run" in data["title"] and "NOT the paper's figures" in data["title"]
    assert data["calibration"]["name"] and data["calibration"]["engines"]
    rows = data["rows"]
    sections = {r["section"] for r in rows}
    assert {"closed form", "Llama-4 context", "Ministral waste", "decode batch", "throughput H100",
            "prefix caching", "spec decoding"} <= sections
    by = {r["what"]: r for r in rows}
    assert by["mllama MMMU-pro waste (T=43, I=6193)"]["ours"] == "79.6%"
    assert by["Ministral SWA waste"]["ours"] == "56.25%"
    assert by["Gemma-2 SWA waste"]["ours"] == "25%"
    ctx = {r["what"]: r["value"] for r in rows if r["section"] == "Llama-4 context"}
    assert ctx["Scout 8xH100 jenga"] > 3.5 * ctx["Scout 8xH100 paged"]
    thr = [r for r in rows if r["section"] == "throughput H100"]
    assert len(thr) == 7 and thr[-1]["what"].startswith("geometric mean")
    assert all(r["paper"].endswith("x") and len(r["paper"]) == 6 and r["value"] > 0 for r in thr[:-1])
    assert sum("[v0]" in r["what"] for r in thr) == 3 and sum("[v1]" in r["what"] for r in thr) == 3
    assert all("vs vLLM v" in r["note"] for r in thr[:-1])
    assert [r["paper"] for r in rows if r["section"] == "throughput L4"].count("OOM") == 1


def test_simulate_host_tier_json_and_table(capsys):
    """--host-kv-memory 2x: a tier of twice the device pool; its figures in the JSON and a second table."""
    args = ["simulate", "--model", "llama-3.1-8b", "--workload", "mmlu-pro", "--requests", "6", "--manager", "jenga",
            "--host-kv-memory", "2x"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["host_memory_bytes"] == 2 * data["memory_bytes"]
    s = data["managers"]["jenga"]
    assert 0 < s["host_total_bytes"] <= data["host_memory_bytes"]
    assert {"host_hit_tokens", "bytes_demoted", "bytes_promoted", "host_copy_s", "host_recompute_s"} <= set(s)
    assert main(args) == 0
    assert "host KV tier" in capsys.readouterr().out
