"""Drift between the installed vLLM and jenga's adapter, found from vLLM's own source.

Every use the installed ``Scheduler`` / ``AsyncScheduler`` / engine core make of
``kv_cache_manager`` (:mod:`vllm_calls`, an ``ast`` walk over vLLM's files) must exist on a
real ``JengaKVCacheAdapter`` and accept the call's arguments, unless
``jenga.vllm.compat.NOT_PROVIDED`` names it with the feature refused at engine start that
leads there.  Every ``Request`` attribute the adapter reads exists on a real vLLM
``Request``.  A vLLM that renames a call fails here, not in a user's server.
``make test`` runs this module once per vLLM version (0.32 in ``.venv``, 0.33 and 0.34 in
their own venvs)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import vllm
from vllm import SamplingParams
from vllm.v1.request import Request
from vllm_async_driver import async_config, kv_config, make_scheduler
from vllm_calls import installed_uses, summary
from vllm_support import model_dir

import jenga.vllm.adapter
from jenga.vllm import JengaScheduler, compat
from jenga.vllm.plan import rewrite_config

pytestmark = pytest.mark.xdist_group("vllm-async")


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    cfg = async_config(model_dir("llama", tmp_path_factory.getbasetemp()))
    cfg.scheduler_config.async_scheduling = False
    kv = rewrite_config(kv_config(cfg, 2, 64), cfg.model_config.max_model_len)
    sched, _ = make_scheduler(JengaScheduler, cfg, kv)
    return sched.kv_cache_manager


def _resolve(obj, chain: str):
    for name in chain.split("."):
        obj = getattr(obj, name)
    return obj


def test_uses_are_found_in_the_installed_source():
    uses = summary(installed_uses())
    print(f"\nvLLM {vllm.__version__}:")
    for chain, shapes in uses.items():
        print(f"  {chain}: {shapes}")
    # the calls every version makes on the request path
    for chain in ("get_computed_blocks", "allocate_slots", "free", "cache_blocks", "get_blocks", "usage"):
        assert chain in uses, chain


def test_every_manager_use_exists_on_the_adapter_with_a_compatible_signature(adapter):
    missing, incompatible, checked = [], [], set()
    for use in installed_uses():
        if use.chain in compat.NOT_PROVIDED:
            continue
        try:
            target = _resolve(adapter, use.chain)
        except AttributeError:
            missing.append(f"{use.chain} ({use.where})")
            continue
        if not use.called or use.starred:
            continue
        args = [object()] * use.num_args
        try:
            inspect.signature(target).bind(*args, **{k: object() for k in use.keywords})
        except TypeError as e:
            incompatible.append(f"{use.chain}({use.num_args} positional, {', '.join(use.keywords)}) at "
                                f"{use.where}: {e}")
        checked.add(use.chain)
    assert not missing, f"vLLM {vllm.__version__} uses kv_cache_manager.{missing}, which the adapter lacks"
    assert not incompatible, incompatible
    # the calls every version makes on the request path were among those checked
    assert {"get_computed_blocks", "allocate_slots", "free", "cache_blocks", "get_blocks"} <= checked, checked


def test_every_not_provided_use_is_absent_from_the_adapter(adapter):
    # a name both provided and declared refused would hide a drift of its signature
    for chain in compat.NOT_PROVIDED:
        with pytest.raises(AttributeError):
            _resolve(adapter, chain)


def _request_attributes(path: Path) -> set[str]:
    """Attributes the module reads off a parameter named ``request``: ``request.x`` and
    ``getattr(request, "x", ...)``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "request":
            out.add(node.attr)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and isinstance(node.args[0], ast.Name) and node.args[0].id == "request"):
            out.add(node.args[1].value)
    return out


def test_every_request_attribute_the_adapter_reads_exists():
    attrs = _request_attributes(Path(jenga.vllm.adapter.__file__))
    assert {"request_id", "all_token_ids", "num_computed_tokens", "cache_salt"} <= attrs
    req = Request("r0", list(range(3, 40)), SamplingParams(max_tokens=4), None)
    absent = sorted(a for a in attrs if not hasattr(req, a))
    assert not absent, f"vLLM {vllm.__version__}'s Request has no {absent}"
