"""Drift between the installed vLLM and jenga's adapter, found from vLLM's own source.

Every use the installed ``Scheduler`` / ``AsyncScheduler`` / engine core make of
``kv_cache_manager`` (:mod:`vllm_calls`, an ``ast`` walk over vLLM's files) must exist on a
real ``JengaKVCacheAdapter`` and accept the call's arguments, unless
``jenga.vllm.compat.NOT_PROVIDED`` names it with the feature refused at engine start that
leads there.  Every ``Request`` attribute the adapter reads exists on a real vLLM
``Request``.  A vLLM that renames a call fails here, not in a user's server.
The same holds for jenga's host-tier KV connector: every connector method the installed vLLM's
scheduler, engine core, workers and model runners call resolves on ``JengaConnector`` with the
call's arguments, every hook jenga's connector overrides is one vLLM's base class still defines,
and the hooks its copies depend on are still called.
``make test`` runs this module once per vLLM version (0.32 in ``.venv``, 0.33 and 0.34 in
their own venvs)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import vllm
from vllm import SamplingParams
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA
from vllm.v1.request import Request
from vllm_async_driver import async_config, kv_config, make_scheduler
from vllm_calls import installed_connector_calls, installed_uses, summary
from vllm_support import model_dir

import jenga.vllm.adapter
from jenga.vllm import JengaScheduler, compat
from jenga.vllm.connector import JengaConnector
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


#: the hooks jenga's host tier needs vLLM to call: the plan handed out (scheduler) and run before the
#: step (workers), the manager bound, the KV buffer registered, hits asked for, finishes told, shutdown
CONNECTOR_HOOKS = ("build_connector_meta", "handle_preemptions", "bind_kv_cache_manager", "register_kv_caches",
                   "get_num_new_matched_tokens", "update_state_after_alloc", "request_finished_all_groups",
                   "shutdown")


def test_every_connector_call_resolves_on_jengas_connector():
    calls = [c for c in installed_connector_calls() if hasattr(KVConnectorBase_V1, c.chain)
             or hasattr(SupportsHMA, c.chain)]
    print(f"\nvLLM {vllm.__version__}: connector calls {sorted({c.chain for c in calls})}")
    missing = sorted(f"{h} (not called by vLLM {vllm.__version__})" for h in CONNECTOR_HOOKS
                     if h not in {c.chain for c in calls})
    assert not missing, missing
    incompatible = []
    for use in calls:
        target = getattr(JengaConnector, use.chain)
        if use.starred or not callable(target) or isinstance(getattr(type, use.chain, None), property):
            continue
        try:
            inspect.signature(target).bind(object(), *[object()] * use.num_args, **{k: object() for k in use.keywords})
        except TypeError as e:
            incompatible.append(f"{use.chain}({use.num_args} positional, {', '.join(use.keywords)}) at {use.where}: {e}")
    assert not incompatible, incompatible


def test_every_hook_jengas_connector_overrides_is_vllms():
    own = [n for n, v in vars(JengaConnector).items() if not n.startswith("__") and (callable(v) or
                                                                                    isinstance(v, property))]
    renamed = [n for n in own if not hasattr(KVConnectorBase_V1, n) and not hasattr(SupportsHMA, n)]
    assert not renamed, f"vLLM {vllm.__version__}'s KV connector base has no {renamed}: jenga's hook is never called"
