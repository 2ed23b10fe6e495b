"""``jenga serve A B``: two models from one pool through the ``openai`` client, routed by ``model``."""

from __future__ import annotations

import argparse
import time

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import jenga
from jenga import SamplingParams
from jenga.server.launch import BackgroundServer
from jenga.server.multi_app import create_multi_app, startup_lines

torch.set_num_threads(1)
MODELS = ("tiny-llama", "tiny-gemma3")
PROMPTS = ["The quick brown fox", "Jenga is a memory manager for"]


@pytest.fixture(scope="module")
def engine():
    return jenga.MultiLLM(MODELS, kv_memory="2MiB", max_model_len=128, max_num_seqs=8)


@pytest.fixture(scope="module")
def server(engine):
    with BackgroundServer(create_multi_app(engine, max_waiting=32)) as srv:
        yield srv


def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)


def scrape(srv) -> dict:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_models_lists_every_served_model(server):
    assert [m.id for m in client(server).models.list().data] == list(MODELS)


def test_requests_are_routed_by_model_and_equal_each_model_alone(server):
    c = client(server)
    for name in MODELS:
        solo = jenga.LLM(name, kv_memory="2MiB")
        for p in PROMPTS:
            want = solo.generate(p, SamplingParams(max_tokens=8, temperature=0.0))[0]
            got = c.completions.create(model=name, prompt=p, max_tokens=8, temperature=0)
            assert got.choices[0].text == want.text and got.model == name
            chunks = list(c.completions.create(model=name, prompt=p, max_tokens=8, temperature=0, stream=True))
            assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == want.text


def test_unknown_model_gets_an_openai_404_naming_the_served_models(server):
    with pytest.raises(openai.NotFoundError) as e:
        client(server).completions.create(model="tiny-qwen3", prompt="hi", max_tokens=2)
    body = e.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert "'tiny-llama', 'tiny-gemma3'" in body["message"] and "tiny-qwen3" in body["message"]
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": None, "messages": [{"role": "user",
                                                                                           "content": "x"}]})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_metrics_per_model(server, engine):
    c = client(server)
    for _ in range(2):  # the second time the prompt is a prefix hit, for gemma only
        c.completions.create(model="tiny-gemma3", prompt=[5 + i for i in range(40)], max_tokens=2, temperature=0)
    deadline = time.monotonic() + 10
    while (m := scrape(server))[("jenga_kv_used_bytes", ())] and time.monotonic() < deadline:
        time.sleep(0.05)
    llama, gemma = (("model", "tiny-llama"),), (("model", "tiny-gemma3"),)
    assert m[("jenga_model_prefix_hit_tokens_total", gemma)] >= 32
    assert m[("jenga_model_prefix_hit_tokens_total", llama)] == engine.manager.scopes.hit_tokens[0]
    assert m[("jenga_model_kv_floor_bytes", gemma)] == engine.manager.model_floor_bytes("tiny-gemma3") > 0
    for labels in (llama, gemma):
        for name in ("jenga_model_kv_used_bytes", "jenga_model_kv_waste_bytes", "jenga_model_requests_waiting",
                     "jenga_model_preemptions_total"):
            assert m[(name, labels)] == 0
    server.service.engine.call(lambda e: e.manager.check_integrity()).result(10)


def test_startup_lines_and_cli(engine):
    lines = startup_lines(engine)
    assert "2 models in one pool" in lines[0] and "large pages of 160.00 KiB" in lines[0]
    assert lines[1].startswith("  tiny-llama: groups full 32.00 KiB x 5; floor 2 large pages")
    assert lines[2].startswith("  tiny-gemma3: groups sliding 80.00 KiB x 2, full 16.00 KiB x 10; floor")
    from jenga.cli import build_parser

    args = build_parser().parse_args(["serve", "tiny-llama", "tiny-llama", "--kv-memory", "2MiB"])
    from jenga.server.cli import build_app

    with pytest.raises(jenga.errors.InvalidArgumentError, match="named twice"):
        build_app(args)
    assert isinstance(args, argparse.Namespace)
