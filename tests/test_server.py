"""``jenga serve`` through the official ``openai`` client, on a free loopback port.

The served model is a local directory (tiny Gemma-3 weights, a byte-level BPE tokenizer
with a chat template); the built-in tiny-gemma3 it was written from is the offline reference.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
import torch
from conftest import write_model_dir
from prometheus_client.parser import text_string_to_metric_families

import jenga
from jenga import SamplingParams
from jenga.server.app import create_app
from jenga.server.launch import BackgroundServer

torch.set_num_threads(1)
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
PROMPTS = ["The quick brown fox", "Jenga is a memory manager for", "def generate(prompts):"]
KEY, KEY2 = "sekret", "other-tenant"


@pytest.fixture(scope="module")
def ref():
    """The offline reference: the built-in tiny-gemma3 whose weights the served directory holds."""
    return jenga.LLM("tiny-gemma3", kv_memory="8MiB")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, ref):
    from transformers import PreTrainedTokenizerFast

    from jenga.engine.tokenizer import _train_bpe

    tok = PreTrainedTokenizerFast(tokenizer_object=_train_bpe(512), bos_token="<bos>", eos_token="<eos>",
                                  pad_token="<pad>", chat_template=TEMPLATE)
    return write_model_dir(tmp_path_factory.mktemp("tiny"), ref, tokenizer=tok)


@pytest.fixture(scope="module")
def server(model_dir):
    llm = jenga.LLM(str(model_dir), kv_memory="8MiB", max_num_seqs=8)
    with BackgroundServer(create_app(llm, model_name="tiny", max_waiting=64)) as srv:
        yield srv


@pytest.fixture(scope="module")
def guarded():
    """tiny-llama (no chat template) with two API keys (tenants), a 4 KiB body limit, one running and two
    waiting requests."""
    llm = jenga.LLM("tiny-llama", kv_memory="4MiB", max_num_seqs=1)
    with BackgroundServer(create_app(llm, model_name="tiny-llama", api_key=[KEY, KEY2], max_waiting=2,
                                     max_body_bytes=4096)) as srv:
        yield srv


def client(srv, key="none", **kw):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, **kw)


def scrape(srv, key=None) -> dict:
    out = {}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    for fam in text_string_to_metric_families(httpx.get(srv.url + "/metrics", headers=headers).text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def wait_idle(srv, timeout=10.0, key=None) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(srv, key)
        if (m[("jenga_requests_running", ())] == 0 and m[("jenga_kv_used_bytes", ())] == 0) \
                or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def integrity(srv) -> None:
    srv.service.engine.call(lambda llm: llm.manager.check_integrity()).result(10)


CASES = [dict(max_tokens=12, temperature=0.0), dict(max_tokens=10, temperature=0.9, top_p=0.9, seed=7),
         dict(max_tokens=10, temperature=1.2, seed=3, extra_body={"top_k": 20})]


def offline(ref, prompt_ids, case) -> jenga.RequestOutput:
    extra = case.get("extra_body", {})
    sp = SamplingParams(max_tokens=case["max_tokens"], temperature=case["temperature"], top_p=case.get("top_p", 1.0),
                        seed=case.get("seed"), top_k=extra.get("top_k", -1), stop=tuple(case.get("stop", ())))
    return ref.generate({"prompt_token_ids": prompt_ids}, sp)[0]


@pytest.mark.parametrize("case", CASES)
def test_completions_equal_generate(server, ref, case):
    c = client(server)
    for p in PROMPTS[:2]:
        want = offline(ref, ref.tokenizer.encode(p), case)
        got = c.completions.create(model="tiny", prompt=p, **case)
        assert got.choices[0].text == want.text
        assert got.usage.completion_tokens == len(want.token_ids)
        assert got.usage.prompt_tokens == len(want.prompt_token_ids)
        assert got.choices[0].finish_reason == want.finish_reason
        chunks = list(c.completions.create(model="tiny", prompt=p, stream=True, **case))
        assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == want.text
        assert chunks[-1].usage.completion_tokens == len(want.token_ids)
        assert chunks[-1].choices[0].finish_reason == want.finish_reason


def test_token_id_prompt_and_usage_chunk(server, ref):
    ids = ref.tokenizer.encode(PROMPTS[0])
    want = offline(ref, ids, CASES[0])
    c = client(server)
    assert c.completions.create(model="tiny", prompt=ids, **CASES[0]).choices[0].text == want.text
    chunks = list(c.completions.create(model="tiny", prompt=ids, stream=True, stream_options={"include_usage": True},
                                       **CASES[0]))
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == len(ids) + len(want.token_ids)


def test_stop_strings(server, ref):
    ids = ref.tokenizer.encode(PROMPTS[1])
    free = offline(ref, ids, dict(max_tokens=16, temperature=0.0)).text
    stop = free[len(free) // 2: len(free) // 2 + 2]
    want = offline(ref, ids, dict(max_tokens=16, temperature=0.0, stop=[stop]))
    assert want.finish_reason == "stop" and stop not in want.text
    c = client(server)
    got = c.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=16, temperature=0, stop=[stop])
    assert (got.choices[0].text, got.choices[0].finish_reason) == (want.text, "stop")
    chunks = list(c.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=16, temperature=0, stop=stop,
                                       stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == want.text


def test_chat_equals_generate(server, ref):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about pages."}]
    hf = server.service.tokenizer.backend  # the directory's own tokenizer, with its chat template
    text = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids = hf(text, add_special_tokens=False)["input_ids"]
    want = offline(ref, ids, dict(max_tokens=12, temperature=0.0))
    c = client(server)
    got = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0)
    assert got.choices[0].message.content == want.text and got.choices[0].message.role == "assistant"
    assert got.usage.prompt_tokens == len(ids)
    chunks = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want.text
    assert chunks[-1].usage.completion_tokens == len(want.token_ids)


def test_models_and_health(server):
    assert [m.id for m in client(server).models.list().data] == ["tiny"]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


BAD = [(dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"), (dict(max_tokens=0), "max_tokens"),
       (dict(n=2), "n"), (dict(logprobs=6), "logprobs"), (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
       (dict(presence_penalty=0.5), "presence_penalty"), (dict(extra_body={"top_k": 0}), "top_k"),
       (dict(extra_body={"cache_salt": ""}), "cache_salt"), (dict(max_tokens=5000), "max_tokens"),
       (dict(prompt=[7, 10**6]), "prompt"), (dict(prompt=""), "prompt"), (dict(best_of=3), "best_of")]


@pytest.mark.parametrize("kwargs,param", BAD, ids=[p for _, p in BAD])
def test_bad_parameters_get_400(server, kwargs, param):
    args = dict(model="tiny", prompt="hello", max_tokens=4) | kwargs
    with pytest.raises(openai.BadRequestError) as e:
        client(server).completions.create(**args)
    err = e.value.body
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


def test_too_long_prompt_names_both_lengths(server):
    with pytest.raises(openai.BadRequestError) as e:
        client(server).completions.create(model="tiny", prompt=[5] * 5000, max_tokens=4)
    msg = e.value.body["message"]
    assert "5000" in msg and "4096" in msg
    with pytest.raises(openai.NotFoundError):
        client(server).completions.create(model="other", prompt="hi", max_tokens=2)
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()


def test_cancelled_stream_frees_pages(server, ref):
    before = scrape(server)
    c = client(server)
    stream = c.completions.create(model="tiny", prompt=PROMPTS[2] * 8, max_tokens=400, temperature=0, stream=True,
                                  extra_body={"ignore_eos": True})
    seen = 0
    for _ch in stream:
        seen += 1
        if seen == 3:
            break
    stream.close()
    # meanwhile another request runs to the same result as offline
    got = c.completions.create(model="tiny", prompt=PROMPTS[0], **CASES[0]).choices[0].text
    assert got == offline(ref, ref.tokenizer.encode(PROMPTS[0]), CASES[0]).text
    after = wait_idle(server)
    key = ("jenga_request_aborted_total", ())
    assert after[key] == before[key] + 1
    assert after[("jenga_requests_finished_total", (("reason", "abort"),))] == \
        before[("jenga_requests_finished_total", (("reason", "abort"),))] + 1
    assert after[("jenga_kv_used_bytes", ())] == 0
    integrity(server)


def test_disconnected_client_is_aborted(server):
    before = scrape(server)[("jenga_request_aborted_total", ())]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", timeout=0.5,
                   json=dict(model="tiny", prompt=PROMPTS[1] * 8, max_tokens=1000, temperature=0, ignore_eos=True))
    m = wait_idle(server)
    assert m[("jenga_request_aborted_total", ())] == before + 1 and m[("jenga_kv_used_bytes", ())] == 0
    integrity(server)


def test_metrics_move(server):
    before = scrape(server)
    prompt = " ".join(["pages for every layer group"] * 6)
    c = client(server)
    for _ in range(2):  # the second request hits the first one's prefix
        c.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    after = wait_idle(server)

    def moved(name, labels=()):
        return after[(name, labels)] - before.get((name, labels), 0)

    assert moved("jenga_requests_finished_total", (("reason", "length"),)) == 2
    assert moved("jenga_time_to_first_token_seconds_count") == 2
    assert moved("jenga_time_per_output_token_seconds_count") == 2
    assert moved("jenga_prefix_query_tokens_total") >= 2 * 30 and moved("jenga_prefix_hit_tokens_total") >= 16
    assert after[("jenga_kv_total_bytes", ())] == after[("jenga_kv_used_bytes", ())] + \
        after[("jenga_kv_cached_bytes", ())] + after[("jenga_kv_free_bytes", ())]
    assert after[("jenga_kv_cached_bytes", ())] > 0
    groups = {dict(k[1])["group"] for k in after if k[0] == "jenga_kv_group_used_bytes"}
    assert groups == {"sliding", "full"}
    assert {dict(k[1])["cause"] for k in after if k[0] == "jenga_kv_waste_bytes"} == \
        {"large_page", "partial_page", "out_of_window", "padding"}
    for name in ("jenga_requests_waiting", "jenga_preemptions_total"):
        assert (name, ()) in after


def test_cache_salt_keeps_tenants_apart(server):
    prompt = " ".join(["tenant data block"] * 10)
    c = client(server)
    c.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0, extra_body={"cache_salt": "a"})
    before = scrape(server)[("jenga_prefix_hit_tokens_total", ())]
    c.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0, extra_body={"cache_salt": "b"})
    assert scrape(server)[("jenga_prefix_hit_tokens_total", ())] == before
    c.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0, extra_body={"cache_salt": "a"})
    assert scrape(server)[("jenga_prefix_hit_tokens_total", ())] > before


def test_auth(guarded):
    with pytest.raises(openai.AuthenticationError):
        client(guarded, key="wrong").completions.create(model="tiny-llama", prompt=[5, 6], max_tokens=2)
    assert httpx.get(guarded.url + "/metrics").status_code == 401
    assert httpx.get(guarded.url + "/v1/models").status_code == 401
    assert httpx.get(guarded.url + "/health").status_code == 200
    r = client(guarded, key=KEY).completions.create(model="tiny-llama", prompt=[5, 6], max_tokens=2)
    assert r.usage.completion_tokens == 2


def test_no_chat_template_and_body_limit(guarded):
    with pytest.raises(openai.BadRequestError) as e:
        client(guarded, key=KEY).chat.completions.create(model="tiny-llama", max_tokens=2,
                                                         messages=[{"role": "user", "content": "hi"}])
    assert "chat template" in e.value.body["message"]
    big = {"model": "tiny-llama", "prompt": "x" * 10_000}
    r = httpx.post(guarded.url + "/v1/completions", json=big, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

    def chunked():
        yield b'{"model": "tiny-llama", "prompt": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    r = httpx.post(guarded.url + "/v1/completions", content=chunked(),
                   headers={"Authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 413


def test_queue_full_gets_429(guarded):
    async def burst():
        async with httpx.AsyncClient(base_url=guarded.url, headers={"Authorization": f"Bearer {KEY}"},
                                     timeout=60) as h:
            body = dict(model="tiny-llama", prompt=[5, 6, 7], max_tokens=16, ignore_eos=True)
            return await asyncio.gather(*(h.post("/v1/completions", json=body) for _ in range(6)))

    codes = [r.status_code for r in asyncio.run(burst())]
    rejected = [r for r in asyncio.run(burst()) if r.status_code == 429]
    assert codes.count(200) >= 2 and 429 in codes  # at most 2 accepted before the engine runs one; the rest refused
    assert rejected and all(r.headers["retry-after"] == "1" for r in rejected)
    assert rejected[0].json()["error"]["type"] == "rate_limit_error"
    assert wait_idle(guarded, key=KEY)[("jenga_kv_used_bytes", ())] == 0


def test_serve_cli_help(capsys):
    from jenga.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "--api-key" in out and "127.0.0.1" in out and "--max-waiting" in out


def test_failing_step_is_a_500_and_the_server_goes_on(server, ref, monkeypatch):
    llm = server.service.engine.llm
    real = llm.runner.execute
    calls = []

    def execute(plan):  # the next forward fails, later ones run
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected forward failure")
        return real(plan)

    monkeypatch.setattr(llm.runner, "execute", execute)
    with pytest.raises(openai.InternalServerError) as e:
        client(server).completions.create(model="tiny", prompt=PROMPTS[0], **CASES[0])
    assert "injected" in e.value.body["message"]
    got = client(server).completions.create(model="tiny", prompt=PROMPTS[0], **CASES[0]).choices[0].text
    assert got == offline(ref, ref.tokenizer.encode(PROMPTS[0]), CASES[0]).text
    assert wait_idle(server)[("jenga_kv_used_bytes", ())] == 0
    integrity(server)


def test_logprobs_equal_offline_logits(server, ref):
    ids = ref.tokenizer.encode(PROMPTS[1])
    want = ref.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=6, return_logits=True))[0]
    lp = [torch.log_softmax(row, -1) for row in want.logits]
    c = client(server)
    got = c.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=6, temperature=0, logprobs=2).choices[0]
    assert len(got.logprobs.token_logprobs) == len(want.token_ids)
    for row, tok, value, top in zip(lp, want.token_ids, got.logprobs.token_logprobs, got.logprobs.top_logprobs,
                                    strict=True):
        assert value == pytest.approx(float(row[tok]), abs=1e-4) and len(top) <= 2
        assert max(top.values()) == pytest.approx(float(row.max()), abs=1e-4)  # greedy: the top-1 is chosen
    chunks = list(c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                            temperature=0, logprobs=True, top_logprobs=3, stream=True))
    content = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert len(content) == chunks[-1].usage.completion_tokens
    assert all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in content)


def test_each_api_key_has_its_own_prefix_cache(guarded):
    prompt = [5 + i % 300 for i in range(64)]

    def hits(key):
        before = scrape(guarded, KEY)[("jenga_prefix_hit_tokens_total", ())]
        client(guarded, key=key).completions.create(model="tiny-llama", prompt=prompt, max_tokens=1)
        return scrape(guarded, KEY)[("jenga_prefix_hit_tokens_total", ())] - before

    hits(KEY)
    assert hits(KEY2) == 0 and hits(KEY) > 0 and hits(KEY2) > 0


@pytest.fixture(scope="module")
def tiered():
    """tiny-llama with a device pool of about two 100-token prompts and a host tier behind it."""
    llm = jenga.LLM("tiny-llama", kv_memory="512KiB", host_kv_memory="2MiB", max_num_seqs=1)
    with BackgroundServer(create_app(llm, model_name="tiny-llama")) as srv:
        yield srv


def test_host_tier_metrics(tiered):
    before = scrape(tiered)
    gen = torch.Generator().manual_seed(5)
    docs = [torch.randint(3, 500, (100,), generator=gen).tolist() for _ in range(4)]
    c = client(tiered)
    for ids in docs + docs[:1]:  # the first prompt's pages were pushed to host by the next three
        c.completions.create(model="tiny-llama", prompt=ids, max_tokens=2, temperature=0)
    after = wait_idle(tiered)

    def moved(name, labels=()):
        return after[(name, labels)] - before.get((name, labels), 0)

    assert after[("jenga_kv_host_total_bytes", ())] > 0
    assert 0 < after[("jenga_kv_host_used_bytes", ())] <= after[("jenga_kv_host_total_bytes", ())]
    assert moved("jenga_kv_host_demotions_total") > 0 and moved("jenga_kv_host_promotions_total") > 0
    assert moved("jenga_kv_host_copied_bytes_total", (("direction", "demote"),)) > 0
    assert moved("jenga_kv_host_copied_bytes_total", (("direction", "promote"),)) > 0
    assert moved("jenga_prefix_host_hit_tokens_total") >= 96
    st = tiered.service.engine.call(lambda llm: llm.manager.stats()).result(10)
    assert after[("jenga_kv_host_demotions_total", ())] == st.demotions  # the counters follow the manager's
    assert after[("jenga_kv_host_copied_bytes_total", (("direction", "promote"),))] == st.bytes_promoted
    integrity(tiered)
    from jenga.server.cli import startup_line

    line = startup_line(tiered.service.engine.llm, "tiny-llama")
    assert line.endswith(f"host tier {(2 << 20) // (32 << 10)} large pages")  # 2 MiB of 32 KiB large pages
