"""vLLM's OpenAI server with ``--scheduler-cls jenga.vllm.JengaScheduler``, driven by the
official ``openai`` client: streaming equals the non-streamed completion, a second request
on the same prompt hits jenga's prefix cache, a stream cancelled mid-way is aborted, and
afterwards no page is held (the server's own KV-cache usage gauge, which is jenga's).
A server process starts and imports vLLM: about 65 s wall on this 2-core machine (in ``make test``)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from vllm_support import BLOCK, JENGA, model_dir

from jenga.vllm.metrics import DIR_ENV

pytestmark = pytest.mark.xdist_group("vllm-server")

PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 12)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metric(base: str, name: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    vals = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)]
    assert vals, f"metric {name} not exported"
    return sum(vals)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = model_dir("llama", tmp_path_factory.getbasetemp())
    port = _free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", path, "--host", "127.0.0.1",
           "--port", str(port), "--scheduler-cls", JENGA, "--dtype", "float32", "--enforce-eager",
           "--max-model-len", "512", "--block-size", str(BLOCK), "--kv-cache-memory-bytes", str(16 << 20),
           "--max-num-seqs", "8", "--served-model-name", "tiny"]
    log = open(tmp_path_factory.getbasetemp() / "vllm_server.log", "w")
    # The server's own snapshot folder: the pytest worker's (set by in-process engines) holds other engines' figures.
    # INFO: the start-up line is an info record (a benchmark module imported by another test in this worker may
    # have set VLLM_LOGGING_LEVEL=WARNING in os.environ)
    env = {**os.environ, "OMP_NUM_THREADS": "1", DIR_ENV: str(tmp_path_factory.mktemp("vllm_metrics")),
           "VLLM_LOGGING_LEVEL": "INFO"}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 420
        while True:
            assert proc.poll() is None, f"server exited; see {log.name}"
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, f"server did not start; see {log.name}"
            time.sleep(1)
        yield base, openai.OpenAI(base_url=f"{base}/v1", api_key="none"), log.name
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _idle(base: str) -> float:
    deadline = time.time() + 60
    while _metric(base, "vllm:num_requests_running") or _metric(base, "vllm:num_requests_waiting"):
        assert time.time() < deadline, "requests still running"
        time.sleep(0.5)
    return _metric(base, "vllm:kv_cache_usage_perc")


def test_streaming_equals_plain_and_hits_the_prefix_cache(server):
    base, client, _ = server
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0)
    stream = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, stream=True)
    text = "".join(chunk.choices[0].text for chunk in stream)
    assert text == plain.choices[0].text and plain.usage.completion_tokens == 16
    assert _metric(base, "vllm:prefix_cache_hits_total") > 0


def test_cancelled_stream_is_aborted_and_every_page_reclaimed(server):
    base, client, _ = server
    _idle(base)
    generated = _metric(base, "vllm:generation_tokens_total")
    stream = client.completions.create(model="tiny", prompt=PROMPT + " again", max_tokens=300, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    got = 0
    for _chunk in stream:
        got += 1
        if got == 3:
            break
    stream.close()  # the client disconnects mid-stream
    assert _idle(base) == 0.0
    # aborted: it stopped short of its 300 tokens (ignore_eos: nothing else ends it early)
    assert 3 <= _metric(base, "vllm:generation_tokens_total") - generated < 300
    ok = client.completions.create(model="tiny", prompt="after the cancel", max_tokens=4, temperature=0)
    assert ok.usage.completion_tokens == 4
    assert _idle(base) == 0.0


def _labelled(base: str, name: str) -> dict[str, float]:
    """``label value -> value`` of a gauge with one label besides ``engine``."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    out = {}
    for m in re.finditer(rf"^{re.escape(name)}{{([^}}]*)}} ([0-9.e+-]+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        labels.pop("engine")
        out[labels.popitem()[1]] = float(m.group(2))
    return out


def test_jengas_figures_on_vllms_metrics_and_its_start_up_line(server):
    """The engine core (another process) publishes jenga's figures; the server's /metrics shows
    them next to vLLM's: pool, bytes per group, waste by cause, prefix misses by reason."""
    base, client, log = server
    for _ in range(2):  # a cold miss, then a hit
        client.completions.create(model="tiny", prompt=PROMPT + " metrics", max_tokens=2, temperature=0)
    _idle(base)
    time.sleep(1.5)  # the engine core refreshes its figures at most once a second, with vLLM's stats
    client.completions.create(model="tiny", prompt="refresh", max_tokens=2, temperature=0)
    assert _metric(base, "jenga_kv_pool_bytes") > 0
    assert set(_labelled(base, "jenga_kv_used_bytes")) == {"g0.full"}
    assert {"large_page", "out_of_window", "padding"} <= set(_labelled(base, "jenga_kv_waste_bytes"))
    misses = _labelled(base, "jenga_prefix_miss_tokens")
    assert set(misses) == {"window_evicted", "no_checkpoint", "evicted", "other_salt", "never_cached"}
    assert misses["never_cached"] > 0
    assert 0 < _metric(base, "jenga_prefix_hit_tokens") < _metric(base, "jenga_prefix_query_tokens")
    with open(log) as f:
        assert re.search(r"jenga active: .*groups: g0\.full \(\d+ layers, page .*large page .*pool \d+ large pages",
                         f.read())
