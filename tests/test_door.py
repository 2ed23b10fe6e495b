"""What a new user meets first: the command line's version, one-line typed errors for bad
config files, devices, names and ports; warnings for configs without sizes; OpenAI error
objects for every 4xx; the serve start-up line; one length rule offline and on the server."""

from __future__ import annotations

import json
import socket

import pytest
from fastapi.testclient import TestClient

import jenga
from jenga.cli import main
from jenga.errors import InsufficientMemoryError, JengaError, SequenceTooLongError
from jenga.structure.source import MissingSizesWarning


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("jenga 0.")


@pytest.fixture
def bad_configs(tmp_path):
    out = {}
    for name, text in (("list", "[1, 2]"), ("broken", "{not json")):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(text)
        out[name] = d
    return out


@pytest.mark.parametrize("kind", ["list", "broken"])
@pytest.mark.parametrize("command", [["plan", "--model"], ["simulate", "--model"], ["serve"]])
def test_bad_config_file_is_one_typed_line(capsys, bad_configs, kind, command):
    extra = ["--workload", "arxiv-qa", "--gpu", "h100-80gb"] if command[0] == "simulate" else []
    rc, _, err = run_cli(capsys, *command, str(bad_configs[kind]), *extra)
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "config.json" in err and ("JSON list" in err if kind == "list" else "not valid JSON" in err)


def test_config_without_sizes_warns():
    with pytest.warns(MissingSizesWarning, match="hidden_size"):
        jenga.ModelSpec.from_hf_config({"model_type": "llama"})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingSizesWarning)
        jenga.ModelSpec.from_hf_config("llama-3.1-8b")  # the catalog: complete, no warning
        from jenga.engine.tiny import TINY_MODELS, tiny_hf_config

        for name in TINY_MODELS:  # complete configs as dicts (Nemotron-H: layers from its pattern)
            jenga.ModelSpec.from_hf_config(tiny_hf_config(name).to_dict())


def test_config_without_sizes_warns_on_the_command_line(capsys, tmp_path, monkeypatch):
    import warnings

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # main sets its one-line format
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.warns(MissingSizesWarning, match="defaults for 'llama'"):
        rc, _, _ = run_cli(capsys, "plan", "--model", str(tmp_path), "--json")
    assert rc == 0 and warnings.formatwarning("m", MissingSizesWarning, "f.py", 1) == "jenga: warning: m\n"


def test_serve_without_cuda_is_one_typed_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    rc, _, err = run_cli(capsys, "serve", "tiny-llama", "--device", "cuda", "--port", "0")
    assert rc == 2 and "no CUDA device" in err and "Traceback" not in err


def test_port_in_use_is_found_before_the_model_loads(capsys, monkeypatch):
    import jenga.server.cli as serve_cli

    def no_build(args):
        raise AssertionError("the model was built before the port was checked")

    monkeypatch.setattr(serve_cli, "build_app", no_build)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        rc, _, err = run_cli(capsys, "serve", "tiny-llama", "--port", str(busy.getsockname()[1]))
    assert rc == 2 and "cannot listen on 127.0.0.1" in err and "--port" in err


def test_name_hints_across_catalog_and_tiny_lists(capsys):
    rc, _, err = run_cli(capsys, "plan", "--model", "tiny-gemma3")
    assert rc == 2 and "built-in tiny models" in err
    with pytest.raises(JengaError, match="catalog name.*'tiny-gemma3'"):
        jenga.LLM("gemma-3-4b")
    with pytest.raises(JengaError, match="hub id.*download it.*pass the directory"):
        jenga.LLM("google/gemma-3-4b-it")
    rc, _, err = run_cli(capsys, "plan", "--model", "meta-llama/Llama-3.1-8B")
    assert rc == 2 and "download it" in err


def test_plan_notes_a_figure_past_the_models_maximum(capsys):
    rc, out, _ = run_cli(capsys, "plan", "--model", "llama-3.1-8b", "--json")
    notes = json.loads(out)["notes"]
    assert rc == 0 and any("jenga" in n and "131072" in n for n in notes)
    rc, out, _ = run_cli(capsys, "plan", "--model", "llama-3.1-8b", "--memory", "1GiB", "--json")
    assert json.loads(out)["notes"] == []  # 8k tokens: within the model's maximum


def test_readme_page_tables_comment_holds():
    mgr = jenga.KVCacheManager(jenga.ModelSpec.from_hf_config("gemma-3-27b"), 64 << 30)
    mgr.add_request("r1", list(range(5000)))
    tables = mgr.allocate("r1", 5000 - mgr.lookup("r1"))
    from jenga.core.tables import PageTables, TokenTable

    token = [g for g in tables.groups if isinstance(g, TokenTable)]  # the README's `tables.groups[g].page_ids`
    assert isinstance(tables, PageTables) and len(token) == 2 and all(len(g.page_ids) > 0 for g in token)


@pytest.fixture(scope="module")
def llm():
    return jenga.LLM("tiny-llama", random_weights=True, kv_memory="1MiB")


def test_offline_max_tokens_past_the_length_is_refused(llm):
    assert llm.limits.max_len < llm.limits.model_max_len  # 1 MiB: the KV cache is the limit
    with pytest.raises(InsufficientMemoryError, match="max_tokens"):
        llm.generate([[5] * 10], jenga.SamplingParams(max_tokens=llm.limits.max_len))
    big = jenga.LLM("tiny-llama", random_weights=True, kv_memory="16MiB")
    with pytest.raises(SequenceTooLongError, match="maximum context length is 4096"):
        big.generate([[5] * 10], jenga.SamplingParams(max_tokens=4090))
    assert not big.has_unfinished and not big.manager.requests
    out = llm.generate([[5] * 10], jenga.SamplingParams(max_tokens=llm.limits.max_len - 10, ignore_eos=True))
    assert len(out[0].token_ids) == llm.limits.max_len - 10  # exactly at the limit: runs to the end


def test_server_4xx_are_openai_error_objects(llm):
    from jenga.server.app import create_app

    app = create_app(llm, model_name="tiny-llama")
    c = TestClient(app)  # no lifespan: these answers never reach the engine
    cases = [c.get("/no/such/route"), c.get("/v1/completions"),
             c.post("/v1/completions", content=b'{"model": "x", "prompt": [1, 2', headers={"content-type": "application/json"})]
    for r, status in zip(cases, (404, 405, 400), strict=True):
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["param"] is None and err["message"]
    assert app.state.service.max_len == llm.limits.max_len  # the server's length check is the engine's rule


def test_serve_startup_line(llm):
    from jenga.capacity import max_concurrent_requests
    from jenga.server.cli import startup_line

    line = startup_line(llm, "tiny-llama")
    mgr = llm.manager
    assert f"{mgr.alloc.num_large} large pages" in line and "KV budget 1.00 MiB" in line
    assert f"longest request {llm.limits.max_len} tokens" in line
    assert line.endswith(f"fit at once: {max_concurrent_requests(mgr, 4096)}")
