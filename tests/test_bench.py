"""``jenga bench --json`` on a tiny setting: runs both managers and reports measured figures."""

from __future__ import annotations

import json
import math

from jenga.cli import main

KEYS = {"tokens_per_s", "requests_per_s", "decode_batch_mean", "waste_frac_mean", "preemptions", "prefix_hit_rate",
        "peak_kv_used_bytes", "peak_kv_needed_bytes", "wall_s"}


def test_bench_json(capsys):
    code = main(["bench", "--json", "--requests", "6", "--prompt-min", "40", "--prompt-max", "90",
                 "--output-len", "6", "--kv-memory", "2MiB", "--shared-prefix", "32"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["managers"]) == {"jenga", "paged"}
    for name, res in data["managers"].items():
        assert KEYS <= set(res), f"{name} lacks {KEYS - set(res)}"
        assert res["tokens_per_s"] > 0 and res["output_tokens"] == 36
        assert 0.0 <= res["waste_frac_mean"] <= 1.0 and 0.0 <= res["prefix_hit_rate"] <= 1.0
    ratio = data["ratio_tokens_per_s"]
    assert isinstance(ratio, float) and math.isfinite(ratio) and ratio > 0
    assert ratio == data["managers"]["jenga"]["tokens_per_s"] / data["managers"]["paged"]["tokens_per_s"]
    assert data["managers"]["jenga"]["prefix_hit_rate"] > 0  # the shared system prompt is reused


def test_bench_table_runs(capsys):
    assert main(["bench", "--requests", "3", "--prompt-min", "20", "--prompt-max", "40", "--output-len", "3",
                 "--kv-memory", "2MiB", "--managers", "jenga", "--shared-prefix", "0"]) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "prefix hits at first admission" in out and "re-read after preemption" in out


def test_bench_splits_first_admission_hits_from_rereads(capsys):
    """Distinct prompts under pressure: paged preempts and re-reads its own cached pages when the
    preempted requests come back; none of that is a hit at first admission (no prompt shares a
    prefix).  With a shared system prompt the first-admission hits appear."""
    common = ["bench", "--json", "--requests", "6", "--prompt-min", "100", "--prompt-max", "130", "--output-len",
              "48", "--kv-memory", "3MiB", "--max-num-batched-tokens", "256", "--managers", "paged", "--shared-prefix", "0"]
    assert main(common) == 0
    res = json.loads(capsys.readouterr().out)["managers"]["paged"]
    assert res["preemptions"] > 0 and res["readmission_hit_tokens"] > 0
    assert res["first_admission_hit_rate"] == 0.0
    assert main([*common, "--shared-prefix", "64"]) == 0
    res = json.loads(capsys.readouterr().out)["managers"]["paged"]
    assert res["first_admission_hit_rate"] > 0.3


def test_bench_hybrid_three_managers(capsys):
    """A Mamba hybrid under jenga, paged (state-sized pages) and uniform (vLLM v1's Mamba-forced block)."""
    code = main(["bench", "--json", "--model", "tiny-jamba-1to7", "--requests", "4", "--prompt-min", "70",
                 "--prompt-max", "90", "--output-len", "4", "--kv-memory", "2MiB", "--shared-prefix", "64",
                 "--state-checkpoint-interval", "32", "--max-num-batched-tokens", "64",
                 "--managers", "jenga,paged,uniform"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["managers"]) == {"jenga", "paged", "uniform"}
    for res in data["managers"].values():
        assert res["output_tokens"] == 16 and res["tokens_per_s"] > 0
    assert data["managers"]["jenga"]["prefix_hit_rate"] > 0  # the shared prefix's state checkpoint is reused


def test_bench_host_tier(capsys):
    """--host-kv-memory: the tier's counters over the timed part, in the JSON and the table."""
    from jenga.bench import _print_table

    assert main(["bench", "--requests", "6", "--prompt-min", "200", "--prompt-max", "300", "--output-len", "2",
                 "--kv-memory", "1MiB", "--shared-prefix", "48", "--host-kv-memory", "4MiB", "--managers", "jenga",
                 "--max-num-batched-tokens", "128", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    res = data["managers"]["jenga"]
    assert 0 < res["host_total_bytes"] <= 4 << 20
    assert res["demotions"] > 0 and res["bytes_demoted"] > 0  # the 1 MiB pool evicts; evicted prefixes are kept
    # the shared 48-token system prompt, evicted from the device, is served from host to a later request
    # (nothing else is shared: at most the five requests after the first)
    assert res["promotions"] > 0 and res["bytes_promoted"] > 0
    assert 0 < res["host_hit_tokens"] <= 5 * 48 and res["host_hit_tokens"] % 16 == 0
    _print_table(data)
    out = capsys.readouterr().out
    assert "host hit tokens" in out and "bytes demoted" in out
