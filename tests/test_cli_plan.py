"""`jenga plan`: JSON keys scripts rely on, and the numbers behind them."""

import json

from jenga.cli import main


def plan(capsys, *args) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_json_ministral(capsys):
    d = plan(capsys, "--model", "ministral-8b", "--memory", "64GiB")
    assert {"groups", "lcm_page_bytes", "num_large_pages", "max_context_tokens"} <= d.keys()
    groups = {g["name"]: g for g in d["groups"]}
    assert groups["full"]["layers"] == 9 and groups["sliding"]["layers"] == 27
    assert groups["full"]["page_bytes"] == 16 * 4096 * 9 and groups["sliding"]["page_bytes"] == 16 * 4096 * 27
    assert all({"name", "kind", "layers", "page_bytes", "tokens_per_page"} <= g.keys() for g in d["groups"])
    assert d["lcm_page_bytes"] == 1728 * 1024
    assert d["num_large_pages"] == (64 << 30) // (1728 * 1024) - 1
    paged_page = 16 * 4096 * 36
    n_paged = (64 << 30) // paged_page - 1
    assert d["max_context_tokens"]["paged"] == 16 * n_paged - 1  # the next token's page must fit too
    # jenga: 9 full layers per token + a 32k window in 27 layers: about 4x the paged context
    assert 3.5 < d["max_context_tokens"]["jenga"] / d["max_context_tokens"]["paged"] < 4.0


def test_plan_units_and_other_families(capsys):
    d = plan(capsys, "--model", "llama-4-scout", "--memory", "256GB")
    assert d["memory_bytes"] == 256 * 10**9
    assert {g["kind"] for g in d["groups"]} == {"chunked", "full"}
    ratio = d["max_context_tokens"]["jenga"] / d["max_context_tokens"]["paged"]
    assert 3.5 < ratio < 4.1  # 48 layers per token vs 12 (+ one chunk in 36 layers)
    d = plan(capsys, "--model", "nemotron-h-8b", "--memory", "16GiB")
    assert d["lcm_page_bytes"] == max(g["page_bytes"] for g in d["groups"])  # padded to one Mamba page
    assert 0 < d["pad_frac"] < 0.01


def test_plan_bad_input(capsys):
    assert main(["plan", "--model", "no-such-model", "--json"]) == 2
    assert "Catalog names" in capsys.readouterr().err
    assert main(["plan", "--model", "llama-3.1-8b", "--memory", "lots", "--json"]) == 2
    assert "byte size" in capsys.readouterr().err


def test_plan_tensor_parallel_keeps_token_capacity(capsys):
    one = plan(capsys, "--model", "llama-4-scout", "--memory", "640GiB")
    eight = plan(capsys, "--model", "llama-4-scout", "--memory", "640GiB", "--tp", "8")
    # 8 KV heads over 8 ranks: each rank holds 1/8 of every token in 1/8 of the memory
    for name in ("jenga", "paged"):
        a, b = one["max_context_tokens"][name], eight["max_context_tokens"][name]
        assert abs(a - b) / a < 0.01, (name, a, b)
    d = plan(capsys, "--model", "llama-4-scout", "--gpu", "h100-80gb", "--tp", "8")
    assert 0.5e6 < d["max_context_tokens"]["paged"] < 2.5e6  # paper: 1.3M on 8xH100 (budget assumptions differ)
    assert 3.5 < d["max_context_tokens"]["jenga"] / d["max_context_tokens"]["paged"] < 4.1


def test_plan_sliding_only_model_is_unbounded(capsys):
    d = plan(capsys, "--model", "mistral-7b", "--memory", "16GiB")
    assert d["max_context_tokens"]["jenga"] is None  # every layer keeps a 4096-token window
    assert d["max_context_tokens"]["paged"] > 0  # paged keeps every token
    assert main(["plan", "--model", "mistral-7b", "--memory", "16GiB"]) == 0
    assert "unbounded" in capsys.readouterr().out
