"""Engine robustness: failing steps, interrupts and aborts leak nothing and change no other
request's output; generation_config.json defaults; no fabricated tokenizer; PageTables lifetime."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import full, group, make_manager, mamba, model, sliding, write_model_dir

import jenga
from jenga import SamplingParams
from jenga.errors import DuplicateRequestError, InvalidArgumentError

torch.set_num_threads(1)
P = SamplingParams(max_tokens=8, ignore_eos=True)


def prompts(n, length=20, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 512, (length + 3 * i,), generator=gen).tolist() for i in range(n)]


@pytest.fixture(scope="module")
def llm():
    return jenga.LLM("tiny-gemma3", kv_memory="4MiB", max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def reference(llm):
    return [o.token_ids for o in llm.generate(prompts(4), P)]


def assert_idle(llm):
    llm.manager.check_integrity()
    assert not llm.manager.requests and not llm.has_unfinished
    assert llm.manager.stats().used_bytes == 0


class Boom(Exception):
    pass


def fail_forward_at(llm, monkeypatch, calls, exc=Boom):
    """Make the model forward raise ``exc`` at the given (0-based) call numbers."""
    real, count = llm.runner.execute, [0]

    def execute(plan):
        n = count[0]
        count[0] += 1
        if n in calls:
            raise exc("injected")
        return real(plan)

    monkeypatch.setattr(llm.runner, "execute", execute)


@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_failed_generate_leaves_engine_usable(llm, reference, monkeypatch, exc):
    fail_forward_at(llm, monkeypatch, {3}, exc)
    with pytest.raises(exc):
        llm.generate(prompts(4), P)
    assert_idle(llm)  # every request of the interrupted call was aborted, no page leaked
    monkeypatch.undo()
    assert [o.token_ids for o in llm.generate(prompts(4), P)] == reference
    assert_idle(llm)


def test_failed_step_aborts_only_scheduled(reference, monkeypatch):
    llm = jenga.LLM("tiny-gemma3", kv_memory="4MiB", max_num_seqs=1)
    a, b = (llm.add_request(p, P) for p in prompts(2))
    llm.step()
    fail_forward_at(llm, monkeypatch, {1})
    llm.step()
    with pytest.raises(Boom):
        llm.step()
    assert a.finish_reason == "abort" and not b.finished  # b was waiting: untouched
    llm.manager.check_integrity()
    while llm.has_unfinished:
        llm.step()
    assert b.output_token_ids == reference[1]
    assert_idle(llm)


def test_unfittable_request_is_aborted_and_engine_goes_on():
    llm = jenga.LLM("tiny-llama", kv_memory="1MiB")
    too_long = [3 + i % 500 for i in range(1500)]
    with pytest.raises(jenga.errors.InsufficientMemoryError):
        llm.generate([too_long], P)
    assert_idle(llm)
    assert len(llm.generate(prompts(1), P)[0].token_ids) == 8


def test_abort_frees_pages_and_keeps_others(llm, reference):
    seqs = [llm.add_request(p, P, request_id=f"r{i}") for i, p in enumerate(prompts(4))]
    for _ in range(3):
        llm.step()
    used = llm.manager.stats().used_bytes
    assert llm.abort("r1") and "r1" not in llm.manager.requests
    assert llm.manager.stats().used_bytes < used
    llm.manager.check_integrity()
    assert not llm.abort("r1") and not llm.abort("never")
    while llm.has_unfinished:
        llm.step()
    assert seqs[1].finish_reason == "abort" and len(seqs[1].output_token_ids) < 8
    for i in (0, 2, 3):
        assert seqs[i].output_token_ids == reference[i]
    assert_idle(llm)


def test_abort_waiting_and_duplicate_ids(llm):
    seq = llm.add_request(prompts(1)[0], P, request_id="w")
    with pytest.raises(DuplicateRequestError):
        llm.add_request(prompts(1)[0], P, request_id="w")
    assert llm.abort("w") and seq.finish_reason == "abort"
    assert_idle(llm)


def test_bad_prompt_in_batch_queues_nothing(llm):
    with pytest.raises(InvalidArgumentError):
        llm.generate([prompts(1)[0], [10**9]], P)
    assert_idle(llm)


def test_cache_salt_separates_prefix_hits(llm):
    p = prompts(1, length=64)[0]
    llm.generate([p], P)
    salted = llm.add_request(p, P, cache_salt="tenant-b")
    same = llm.add_request(p, P)
    while llm.has_unfinished:
        llm.step()
    assert salted.prefix_hit_tokens == 0 and same.prefix_hit_tokens > 0
    assert salted.output_token_ids == same.output_token_ids


# ------------------------------------------------------------- model directories
def test_generation_config_eos_list_and_defaults(tmp_path, llm):
    p = prompts(1)[0]
    free_run = llm.generate([p], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    stop_id = free_run[4]
    first = free_run.index(stop_id)
    path = write_model_dir(tmp_path, llm, {"eos_token_id": [2, stop_id], "max_new_tokens": 12, "do_sample": False,
                                     "temperature": 0.7})
    d = jenga.LLM(str(path), kv_memory="4MiB")
    assert d.default_sampling_params.max_tokens == 12 and d.default_sampling_params.greedy
    out = d.generate([p])[0]  # defaults from the file; stops at the extra EOS id like HF
    assert out.token_ids == free_run[:first + 1] and out.finish_reason == "stop"
    assert d.generate([p], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids == free_run


def test_generation_config_sampling_defaults(tmp_path, llm):
    path = write_model_dir(tmp_path, llm, {"do_sample": True, "temperature": 0.6, "top_p": 0.9})
    sp = jenga.LLM(str(path), kv_memory="4MiB").default_sampling_params
    assert (sp.temperature, sp.top_p, sp.top_k, sp.max_tokens) == (0.6, 0.9, 50, 16)


def test_directory_without_tokenizer_files_takes_ids_only(tmp_path, llm):
    path = write_model_dir(tmp_path, llm)
    d = jenga.LLM(str(path), kv_memory="4MiB")
    assert d.tokenizer is None
    with pytest.raises(InvalidArgumentError, match="no tokenizer files"):
        d.generate("hello")
    assert len(d.generate([prompts(1)[0]], P)[0].token_ids) == 8


# ------------------------------------------------------------- PageTables lifetime
def test_page_tables_unchanged_by_other_requests():
    """tables.py's contract: a request's PageTables change only through calls for that
    request; any churn of other requests (hits, evictions, frees) leaves them as they were."""
    spec = model(group("full", full(), 2), group("swa", sliding(8), 2, first_layer=2),
                 group("ssm", mamba(every=4), 1, first_layer=4))
    mgr = make_manager(spec, 24, tokens_per_page=4)
    mgr.add_request("a", list(range(30)))
    mgr.lookup("a")
    t = mgr.allocate("a", 30)
    before = copy.deepcopy(t)
    gen = torch.Generator().manual_seed(1)
    for i in range(40):
        rid = f"o{i}"
        n = int(torch.randint(4, 40, (1,), generator=gen))
        share = i % 3 == 0
        toks = list(range(30))[:n] if share else torch.randint(100, 200, (n,), generator=gen).tolist()
        mgr.add_request(rid, toks)
        mgr.lookup(rid)
        if mgr.allocate(rid, len(toks) - mgr.requests[rid].num_computed) is not None:
            mgr.append_tokens(rid, [7])
        if i % 2 == 0:
            mgr.free(rid)
        mgr.check_integrity()
        assert t == before, f"request a's tables changed after a call for {rid}"
    mgr.append_tokens("a", [5])
    assert mgr.allocate("a", 1) is t  # same object, updated in place by a's own calls (documented)


@pytest.mark.parametrize("where", ["forward", "schedule"])
def test_failed_step_aborts_a_request_sharing_pages_registered_in_it(monkeypatch, where):
    # a registers its prompt's full pages at allocate; b, admitted after it in the same step, hits them;
    # the step fails (in the forward, or in the scheduler right after b's lookup): aborting a first
    # would drop pages b holds, so the newest is aborted first and the step's own error comes out
    llm = jenga.LLM("tiny-llama", kv_memory="4MiB", tokens_per_page=16)
    shared = prompts(1, length=40)[0]
    a, b = llm.add_request(shared, P), llm.add_request(shared + [7, 8, 9], P)
    if where == "forward":
        fail_forward_at(llm, monkeypatch, {0})
    else:
        enter = llm.scheduler._enter

        def enter_then_fail(seq):
            enter(seq)
            if seq is b:
                raise Boom("injected")

        monkeypatch.setattr(llm.scheduler, "_enter", enter_then_fail)
    with pytest.raises(Boom):
        llm.step()
    assert b.prefix_hit_tokens == 32  # b did share a's pages registered in the failed step
    assert a.finish_reason == b.finish_reason == "abort"
    assert_idle(llm)
