"""No partial mutation on bad input (issue 7, item 4): every bad input below raises a typed
``JengaError`` naming the problem, and leaves the manager exactly as it was (``snapshot``,
``stats()``, ``check_integrity()``), for jenga and every baseline behind the same API."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import full, group, mamba, model, serve, snapshot, vision

from jenga.baselines import MANAGER_NAMES, make_manager
from jenga.core.request import ImageRef
from jenga.core.specs import ModelSpec
from jenga.core.validation import checked_token_ids
from jenga.errors import InvalidArgumentError, JengaError, MissingConfigError


def _spec():
    return model(group("full", full(), 1), group("vis", vision(64), 1, first_layer=1),
                 group("m", mamba(4), 1, first_layer=2), max_len=64)


BAD_IDS = [
    ([1, True, 3], "True", 1),
    ([1, 2, 2.0], "2.0", 2),
    (["7"], "'7'", 0),
    ([5, 1 << 32], str(1 << 32), 1),
    ([1, -1], "-1", 1),
    ([None], "None", 0),
    ([1, np.float32(3)], "3.0", 1),
    ([np.bool_(True)], "True", 0),
]


def _expect_unchanged(mgr, fn, *args, match=None, **kw):
    before, stats = snapshot(mgr), mgr.stats()
    with pytest.raises(JengaError, match=match):
        fn(*args, **kw)
    assert snapshot(mgr) == before
    assert mgr.stats() == stats
    mgr.check_integrity()


@pytest.mark.parametrize("name", MANAGER_NAMES)
def test_every_bad_manager_input_changes_nothing(name):
    mgr = make_manager(name, _spec(), "1MiB", tokens_per_page=4)
    serve(mgr, "done", list(range(10, 30)), [5, 6], images=[(2, 3, "cat")])  # something cached
    mgr.add_request("live", list(range(10, 25)))
    mgr.lookup("live")
    assert mgr.allocate("live", 15 - mgr.requests["live"].num_computed) is not None
    u = _expect_unchanged
    for ids, shown, pos in BAD_IDS:
        u(mgr, mgr.append_tokens, "live", ids, match=rf"{shown}.* at position {pos}")
        u(mgr, mgr.add_request, "new", [4, 4] + ids, match=rf"{shown}.* at position {pos + 2}")
    for prompt in (None, "abc", 12, {"a": 1}):
        u(mgr, mgr.add_request, "new", prompt, match="token")
    u(mgr, mgr.append_tokens, "live", "7", match="token")
    u(mgr, mgr.add_request, ["unhashable"], [1, 2], match="hashable")
    for img, why in (((3, 2, "cat"), "past"), ((0, 1), "offset, num_tokens"), ((1, 0, "x"), "num_tokens > 0"),
                     ((True, 1, "x"), "int offset"), ((0, 1, ""), "non-empty"), ((0, 1.5, "x"), "int")):
        u(mgr, mgr.add_request, "new", [1, 2, 3, 4], images=[img], match=why)
    u(mgr, mgr.add_request, "new", [1, 2], cache_salt=b"tenant", match="cache_salt")
    # the request hit by the bad append is still usable: nothing was appended or committed
    mgr.append_tokens("live", [7])
    assert mgr.requests["live"].num_computed == 15 and mgr.requests["live"].tokens[-1] == 7
    mgr.add_request("ok", np.arange(3, 9), images=[ImageRef(np.int64(1), 2, "dog")])  # numpy ints are ints
    assert mgr.requests["ok"].tokens.tolist() == list(range(3, 9)) and type(mgr.requests["ok"].tokens[0]) is int
    mgr.check_integrity()


def test_token_array_is_a_flat_uint32_copy_and_finds_bools_among_zeros_and_ones():
    from array import array

    from jenga.core.validation import token_array
    ids = [0, 1, 5, (1 << 32) - 1, 1]
    for given in (ids, tuple(ids), np.array(ids, dtype=np.uint64), np.array(ids, dtype=np.int64)):
        out = token_array(given, "x")
        assert type(out) is array and out.typecode == "I" and out.tolist() == ids
    assert token_array(range(3), "x").tolist() == [0, 1, 2]
    assert token_array([np.int32(1), 0], "x").tolist() == [1, 0]  # numpy 0 / 1 are ids, not bools
    out = token_array(ids, "x")
    out.append(9)  # a copy the manager may grow: no view of it is left behind
    assert ids == [0, 1, 5, (1 << 32) - 1, 1]
    for bad, pos in (([0, 1, 2, False], 3), ([True] + [1] * 99, 0), ([3] * 50 + [1, 0, True], 52)):
        with pytest.raises(InvalidArgumentError, match=f"at position {pos}"):
            token_array(bad, "x")
    for bad in (np.array([1.0]), np.array([True]), np.array([-1, 2]), np.array([1 << 32]), np.zeros((2, 2), int)):
        with pytest.raises(InvalidArgumentError, match="token id"):
            token_array(bad, "x")


def test_checked_token_ids_fast_path_returns_the_list_itself():
    ids = [1, 2, 3]
    assert checked_token_ids(ids, "x") is ids
    assert checked_token_ids((1, 2), "x") == [1, 2]
    assert checked_token_ids(range(2), "x") == [0, 1]
    assert checked_token_ids([(1 << 32) - 1, 0], "x") == [(1 << 32) - 1, 0]


@pytest.mark.parametrize("name", MANAGER_NAMES)
def test_memory_budget_with_units_and_bad_sizes(name):
    spec = _spec()
    assert make_manager(name, spec, "2MiB", tokens_per_page=4).memory_bytes == 2 << 20
    assert make_manager(name, spec, " 0.5 MiB ", tokens_per_page=4).memory_bytes == 1 << 19
    for bad, why in (("64 potatoes", "byte size"), ("-1GiB", "byte size"), (0, "positive"), (True, "bool"),
                     (None, "byte size")):
        with pytest.raises(InvalidArgumentError, match=why):
            make_manager(name, spec, bad, tokens_per_page=4)
    for kw, why in ((dict(tokens_per_page=0), "tokens_per_page"), (dict(tokens_per_page="16"), "tokens_per_page"),
                    (dict(window_slack=-1), "window_slack"), (dict(tokens_per_page=16), "checkpoint interval 4")):
        with pytest.raises(InvalidArgumentError, match=why):
            make_manager(name, spec, "2MiB", **kw)


LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=256, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=2, intermediate_size=512, vocab_size=1000,
             max_position_embeddings=2048)


@pytest.mark.parametrize("field,value", [("num_key_value_heads", 0), ("num_key_value_heads", -2),
                                         ("num_attention_heads", 0), ("head_dim", 0), ("head_dim", 1.5)])
def test_non_positive_config_sizes_name_the_field(field, value, tmp_path):
    # head counts are checked before transformers parses (it replaces a 0 or divides by it), other
    # sizes by jenga.structure after parsing; either way the error names the field
    with pytest.raises(JengaError, match=f"'{field}'"):
        ModelSpec.from_hf_config({**LLAMA, field: value})
    with pytest.raises(JengaError, match=f"'{field}'"):
        ModelSpec.from_hf_config({"model_type": "gemma3", "text_config": {**LLAMA, field: value}})
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, field: value}))
    with pytest.raises(JengaError, match=f"'{field}'"):
        ModelSpec.from_hf_config(tmp_path)


def test_directory_without_config_json(tmp_path):
    with pytest.raises(MissingConfigError, match="config.json"):
        ModelSpec.from_hf_config(tmp_path)
    with pytest.raises(FileNotFoundError):  # still one, for callers that caught it before
        ModelSpec.from_hf_config(tmp_path)


def test_engine_bad_prompts_queue_nothing():
    import jenga
    from jenga.engine.models.registry import model_class
    from jenga.errors import UnsupportedArchitectureError

    llm = jenga.LLM("tiny-llama", random_weights=True, kv_memory="4MiB")
    stats = llm.manager.stats()
    for prompts, why in ((None, "prompt"), ([[1, 2], [3, 1.5]], "1.5.* at position 1"), ([[1, 2], None], "None"),
                         ([{"prompt_token_ids": "12"}], "token ids"), ([[1, 2], []], "empty")):
        with pytest.raises(InvalidArgumentError, match=why):
            llm.generate(prompts)
        assert not llm.scheduler.has_unfinished and llm.manager.stats() == stats
    llm.manager.check_integrity()
    assert len(llm.generate([[1, 2, 3]], jenga.SamplingParams(max_tokens=2))[0].token_ids) == 2
    with pytest.raises(UnsupportedArchitectureError, match="unsupported model 'bert'"):
        model_class(type("Cfg", (), {"model_type": "bert", "architectures": ["BertModel"]})())


@pytest.mark.parametrize("argv,why", [
    (["bench", "--requests", "0"], "--requests must be >= 1"),
    (["bench", "--kv-memory", "lots"], "byte size"),
    (["bench", "--manager", "jenga,vllm"], "unknown manager"),
    (["plan", "--model", "{tmp}"], "config.json"),
    (["plan", "--model", "gemma-3-27b", "--memory", "0"], "positive"),
])
def test_cli_bad_arguments_are_one_clear_line(argv, why, tmp_path, capsys):
    from jenga.cli import main

    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_unsupported_model_options_are_typed_errors():
    from jenga.engine.models.common import activation
    from jenga.errors import JengaError, UnsupportedFeatureError

    with pytest.raises(UnsupportedFeatureError, match="activation 'nope'") as e:
        activation("nope")
    assert isinstance(e.value, JengaError) and isinstance(e.value, NotImplementedError)
