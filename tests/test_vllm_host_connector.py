"""jenga's host tier inside vLLM, switched on by vLLM's ``kv_offloading_size``, without an engine.

* the switch: ``kv_offloading_size`` with jenga's scheduler selects jenga's connector (same bytes),
  without it vLLM's own; other connectors and too small a host are refused at start;
* the scheduler side at vLLM's scheduler level (runs on 0.32, 0.33 and 0.34): the stand-in runner of
  :mod:`vllm_async_driver` also runs each step's copy plan (the connector metadata) on its KV store,
  moving the (position, token) entries of a page between the device and a host store, and reads
  every hit back: a promoted page that did not get its bytes fails there;
* the worker side: :class:`HostPageCopies` on a real byte buffer, and a copy failing mid-plan.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from vllm.config import KVTransferConfig
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm_async_driver import FakeRunner, async_config, kv_config, make_scheduler, requests, run
from vllm_support import JENGA, model_dir, workloads

from jenga.core.tier.copy_plan import CopyPlan
from jenga.errors import InsufficientMemoryError
from jenga.vllm import JengaAsyncScheduler, JengaScheduler
from jenga.vllm.connector import JengaConnector
from jenga.vllm.host_copies import HostCopyError, HostPageCopies
from jenga.vllm.offloading import CONNECTOR, HostLayout, attach_host_layout, host_bytes
from jenga.vllm.plan import rewrite_config
from jenga.vllm.specs import UnsupportedInVllm

pytestmark = pytest.mark.xdist_group("vllm-async")

HOST_GIB = 0.001  # about 1 MiB of host pages: several times the tight device budget below


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return model_dir("llama", tmp_path_factory.getbasetemp())


def test_kv_offloading_size_selects_jengas_connector_with_its_bytes(path):
    cfg = async_config(path, scheduler_cls=JENGA, kv_offloading_size=HOST_GIB)
    assert cfg.kv_transfer_config.kv_connector == CONNECTOR
    assert cfg.kv_transfer_config.kv_role == "kv_producer"
    assert host_bytes(cfg) == int(HOST_GIB * (1 << 30))
    stock = async_config(path, kv_offloading_size=HOST_GIB)  # vLLM's own scheduler keeps vLLM's connector
    assert stock.kv_transfer_config.kv_connector == "OffloadingConnector"
    assert host_bytes(stock) is None


@pytest.mark.parametrize("name", ["LMCacheMPConnector", "NixlConnector", "OffloadingConnector"])
def test_other_connectors_are_refused_by_name(path, name):
    """LMCache (what ``kv_offloading_backend="lmcache"`` selects), NIXL / P/D, or vLLM's own offloading
    connector named explicitly: refused before any connector is built (lmcache is not installed here,
    so the config is given the connector after it is built, as a user's ``--kv-transfer-config``)."""
    cfg = async_config(path, scheduler_cls=JENGA)
    cfg.scheduler_config.async_scheduling = False
    kv = rewrite_config(kv_config(cfg, 2, 64), cfg.model_config.max_model_len)
    cfg.kv_transfer_config = KVTransferConfig(kv_connector=name, kv_role="kv_both")
    with pytest.raises(UnsupportedInVllm, match=f"KV connector '{cfg.kv_transfer_config.kv_connector}'"):
        make_scheduler(JengaScheduler, cfg, kv)


def test_jengas_connector_named_without_host_bytes_is_refused(path):
    cfg = async_config(path, scheduler_cls=JENGA)
    cfg.kv_transfer_config = KVTransferConfig(kv_connector=CONNECTOR, kv_role="kv_producer")
    with pytest.raises(UnsupportedInVllm, match="set kv_offloading_size"):
        host_bytes(cfg)


def test_a_host_smaller_than_one_large_page_is_one_error_at_start(path):
    cfg = async_config(path, scheduler_cls=JENGA, kv_offloading_size=1e-6)  # about 1 KiB
    kv = rewrite_config(kv_config(cfg, 2, 64), cfg.model_config.max_model_len)
    with pytest.raises(InsufficientMemoryError, match="kv_offloading_size gives the host tier 1073 B"):
        attach_host_layout(cfg, [kv])


class HostRunner(FakeRunner):
    """The stand-in runner that also runs each step's copy plan first, as jenga's connector does in a
    worker: a page's entries are copied between its device block and a host store."""

    def __init__(self, kv_cache_config):
        super().__init__(kv_cache_config)
        plan = kv_cache_config.jenga_plan
        self.exec_id = lambda g, p: p * plan.exec_scale[g] + plan.exec_offset
        self.host: dict[tuple, object] = {}
        self.demoted = self.promoted = 0

    @staticmethod
    def _copy(src: dict, src_keys: list, dst: dict, dst_keys: list) -> None:
        for a, b in zip(src_keys, dst_keys, strict=True):
            if a in src:
                dst[b] = src[a]
            else:
                dst.pop(b, None)

    def execute(self, out):
        plan = out.kv_connector_metadata.plan
        for g, pairs in plan.demote.items():
            for dev, host in pairs.tolist():
                keys = self.page_keys(g, self.exec_id(g, dev))
                self._copy(self.kv, keys, self.host, [(g, host, i) for i in range(len(keys))])
        for g, pairs in plan.promote.items():
            for host, dev in pairs.tolist():
                keys = self.page_keys(g, self.exec_id(g, dev))
                self._copy(self.host, [(g, host, i) for i in range(len(keys))], self.kv, keys)
        self.demoted += sum(len(p) for p in plan.demote.values())
        self.promoted += sum(len(p) for p in plan.promote.values())
        return super().execute(out)


LAYERS = {"sliding": ["full", ("sliding", 64)], "mamba": ["full", "mamba"]}


@pytest.fixture(scope="module", params=list(LAYERS))
def served(request, path):
    """Stock ``AsyncScheduler`` (no offloading) and jenga's with the host tier, the same tight budget,
    the pressure prompts, other documents' prompts, the pressure prompts again (the third round finds
    what the second demoted)."""
    ps, other = workloads()["pressure"], workloads(seed=1)["pressure"]
    prompts, arrivals = ps + other + ps, [0] * len(ps) + [300] * len(other) + [600] * len(ps)
    out = {}
    for name, cls, kw in (("stock", AsyncScheduler, {}),
                          ("jenga", JengaAsyncScheduler, dict(scheduler_cls=JENGA, kv_offloading_size=HOST_GIB))):
        cfg = async_config(path, max_model_len=320, **kw)
        kv = kv_config(cfg, LAYERS[request.param], 20)
        if cls is JengaAsyncScheduler:
            kv = attach_host_layout(cfg, [rewrite_config(kv, cfg.model_config.max_model_len)])[0]
        sched, hash_block = make_scheduler(cls, cfg, kv)
        runner = HostRunner(kv) if cls is JengaAsyncScheduler else None
        tokens, runner, _, _ = run(sched, hash_block, kv, prompts, arrivals=arrivals, runner=runner)
        out[name] = dict(tokens=tokens, sched=sched, runner=runner)
    return out


def test_scheduler_level_copies_serve_host_hits_equal_to_stock(served):
    jenga = served["jenga"]
    sched, runner = jenga["sched"], jenga["runner"]
    assert isinstance(sched.connector, JengaConnector)
    st = sched.jenga.stats()
    assert st.demotions > 0 and st.promotions > 0 and st.host_hit_tokens > 0 and st.evicted_pages > 0, st
    assert (runner.demoted, runner.promoted) == (st.demotions, st.promotions)  # every pair reached the runner
    assert runner.checked > 0  # every hit read back through the block tables (the runner asserts each)
    assert jenga["tokens"] == served["stock"]["tokens"]
    assert sched.jenga.used_bytes == 0 and not sched.jenga.requests
    sched.jenga.check_integrity()  # the host tier's pins, pairs and index included


# ---------------------------------------------------------------------------------------------- worker side
def _buffer_and_copies(layout: HostLayout):
    """A byte buffer of random content with two layers (one per group) viewing it, and the copies over it."""
    gen = torch.Generator().manual_seed(0)
    buf = torch.randint(0, 256, (layout.device_offset + 6 * layout.large_page_bytes,), dtype=torch.uint8, generator=gen)
    kv = {"a": buf[:64].view(torch.float32), "b": [buf[64:128].view(torch.float32)]}  # a state: a list of tensors
    return buf, HostPageCopies(layout, kv, [["a"], ["b"]])


# host: group 0's pages 0, 1 in large pages 0, 1; group 1's pages 6..11 in large pages 2, 3 (as the allocator carves)
LAYOUT = HostLayout(num_large=4, large_page_bytes=96, page_bytes=(96, 32), device_offset=96)


def _rows(buf, g, pages):
    p = LAYOUT.page_bytes[g]
    return [buf[LAYOUT.device_offset + i * p:LAYOUT.device_offset + (i + 1) * p].clone() for i in pages]


def _plan(demote=None, promote=None):
    arr = lambda d: {g: np.asarray(rows, dtype=np.int64).reshape(-1, 2) for g, rows in (d or {}).items()}  # noqa: E731
    return CopyPlan(arr(demote), arr(promote))


def test_worker_copies_pages_both_ways_batched_per_group():
    buf, copies = _buffer_and_copies(LAYOUT)
    before = [_rows(buf, 0, [1, 4]), _rows(buf, 1, [3, 7, 9])]
    copies.execute(_plan(demote={0: [(1, 0), (4, 1)], 1: [(3, 6), (7, 7), (9, 8)]}))
    assert all(torch.equal(copies.host_rows[0][h], r) for h, r in zip([0, 1], before[0], strict=True))
    assert all(torch.equal(copies.host_rows[1][h], r) for h, r in zip([6, 7, 8], before[1], strict=True))
    # promote the host pages back into other device pages; a promote may read what the same plan demotes
    copies.execute(_plan(demote={1: [(11, 9)]}, promote={0: [(1, 2)], 1: [(6, 12), (9, 13)]}))
    assert torch.equal(_rows(buf, 0, [2])[0], before[0][1])
    assert torch.equal(_rows(buf, 1, [12])[0], before[1][0])
    assert torch.equal(_rows(buf, 1, [13])[0], _rows(buf, 1, [11])[0])
    assert (copies.pages_demoted, copies.pages_promoted) == (6, 3)
    assert copies.host_bytes == LAYOUT.total_bytes
    copies.release()
    assert copies.host_bytes == 0


@pytest.mark.parametrize("fail_at", [1, 3])  # the second group's demote read; the second group's promote read
def test_a_copy_failing_mid_plan_writes_no_promoted_page(monkeypatch, fail_at):
    buf, copies = _buffer_and_copies(LAYOUT)
    copies.execute(_plan(demote={0: [(1, 0)], 1: [(3, 6)]}))
    device_before = buf.clone()
    calls = []
    gather = HostPageCopies._gather

    def failing(self, rows, ids, to):
        calls.append(1)
        if len(calls) == fail_at + 1:
            raise RuntimeError("injected copy failure")
        return gather(self, rows, ids, to)

    monkeypatch.setattr(HostPageCopies, "_gather", failing)
    with pytest.raises(HostCopyError, match="injected copy failure"):
        copies.execute(_plan(demote={0: [(2, 1)], 1: [(4, 7)]}, promote={0: [(0, 5)], 1: [(6, 12)]}))
    assert torch.equal(buf, device_before)  # neither group's promoted page was written
    assert copies.pages_promoted == 0


def test_connector_hands_each_plan_out_once_and_runs_it_before_the_step(path):
    """The connector's scheduler side takes the manager's plan into the step's metadata; its worker
    side runs the metadata's plan in ``handle_preemptions`` (vLLM's model runners call it first in
    every step, before its block copies and forward)."""
    cfg = async_config(path, scheduler_cls=JENGA, kv_offloading_size=HOST_GIB)
    cfg.scheduler_config.async_scheduling = False
    kv = attach_host_layout(cfg, [rewrite_config(kv_config(cfg, 2, 64), cfg.model_config.max_model_len)])[0]
    sched, _ = make_scheduler(JengaScheduler, cfg, kv)
    assert sched.connector.manager is sched.jenga
    plans = iter([CopyPlan({0: torch.tensor([[1, 2]]).numpy()}), CopyPlan()])
    sched.jenga.take_copy_plan = lambda: next(plans)
    meta = sched.connector.build_connector_meta(object())
    assert meta.plan.demote[0].tolist() == [[1, 2]]
    assert sched.connector.build_connector_meta(object()).plan.empty
    ran = []
    worker = JengaConnector.__new__(JengaConnector)
    worker.copies = dataclasses.make_dataclass("C", [])()
    worker.copies.execute = ran.append
    worker.handle_preemptions(meta)
    assert ran == [meta.plan]


# ---------------------------------------------------------------------------------------------- KV events
@pytest.fixture(scope="module", params=list(LAYERS))
def published(request, path):
    """jenga's scheduler with the host tier and vLLM's KV events on (``kv_events_config``, the null
    publisher): every batch it publishes, as a subscriber decodes it (msgpack, ``KVEventBatch``)."""
    import msgspec
    from vllm.config import KVEventsConfig
    from vllm.distributed.kv_events import KVEventBatch

    ps, other = workloads()["pressure"], workloads(seed=1)["pressure"]
    cfg = async_config(path, max_model_len=320, scheduler_cls=JENGA, kv_offloading_size=HOST_GIB / 4,  # small: the host evicts too
                       kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"))
    kv = attach_host_layout(cfg, [rewrite_config(kv_config(cfg, LAYERS[request.param], 20),
                                                 cfg.model_config.max_model_len)])[0]
    sched, hash_block = make_scheduler(JengaAsyncScheduler, cfg, kv)
    batches, enc, dec = [], msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(type=KVEventBatch)
    sched.kv_event_publisher.publish = lambda batch: batches.append(dec.decode(enc.encode(batch)))
    run(sched, hash_block, kv, ps + other + ps, arrivals=[0] * len(ps) + [300] * len(other) + [600] * len(ps),
        runner=HostRunner(kv))
    return dict(sched=sched, kv=kv, events=[e for b in batches for e in b.events])


def test_kv_events_name_group_kind_and_tier_and_replay_both_tiers(published):
    """A router replaying the events (per tier and group: stored adds a key, removed drops it) ends
    with exactly what each tier holds; host stores are the demotions, host removals its evictions;
    every stored event names its group's kind as vLLM's own manager does."""
    from vllm.distributed.kv_events import BlockRemoved, BlockStored
    from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind, get_kv_cache_spec_sliding_window

    sched, events = published["sched"], published["events"]
    mgr = sched.jenga
    specs = [g.kv_cache_spec for g in published["kv"].kv_cache_groups]
    held: dict[tuple[str, int], set] = {}
    counts = {(t, m): 0 for t in (BlockStored, BlockRemoved) for m in ("GPU", "CPU")}
    for e in events:
        assert isinstance(e, (BlockStored, BlockRemoved)), e
        counts[(type(e), e.medium)] += 1
        keys = held.setdefault((e.medium, e.group_idx), set())
        (h,) = e.block_hashes
        if isinstance(e, BlockStored):
            assert (e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window) == (
                get_kv_cache_spec_kind(specs[e.group_idx]).value,
                get_kv_cache_spec_sliding_window(specs[e.group_idx]))
            if e.medium == "CPU":  # a demotion: the device still holds the key it announced with its tokens
                assert h in held.get(("GPU", e.group_idx), ()) and e.token_ids == [], e
            assert h not in keys, f"{e.medium} group {e.group_idx}: stored twice"
            keys.add(h)
        else:
            assert h in keys, f"{e.medium} group {e.group_idx}: removed a key never stored"
            keys.discard(h)
    st = mgr.stats()
    print(f"\nevents { {f'{t.__name__} {m}': n for (t, m), n in counts.items()} }, demotions {st.demotions}")
    assert min(counts.values()) > 0, counts  # stored and removed on both tiers
    assert counts[(BlockStored, "CPU")] == st.demotions > 0
    assert {(e.kv_cache_spec_kind) for e in events if isinstance(e, BlockStored)} == {
        get_kv_cache_spec_kind(s).value for s in specs}
    for g in range(len(specs)):  # the keys are vLLM's block hashes (jenga's index is keyed by them)
        assert held.get(("GPU", g), set()) == set(mgr.index.table[g]), f"device group {g}"
        assert held.get(("CPU", g), set()) == set(mgr.host.index.table[g]), f"host group {g}"


# ---------------------------------------------------------------------------------------------- salts and LoRA
def _tenants(kind: str) -> tuple[dict, dict]:
    from vllm.lora.request import LoRARequest

    if kind == "salt":
        return dict(cache_salt="tenant-a"), dict(cache_salt="tenant-b")
    return (dict(lora_request=LoRARequest("a", 1, "/adapters/a")),  # the scheduler reads its name only
            dict(lora_request=LoRARequest("b", 2, "/adapters/b")))


@pytest.mark.parametrize("kind", ["salt", "lora"])
def test_salts_and_lora_keep_host_pages_apart(path, kind):
    """One prompt under tenant (or adapter) A, other documents until A's pages left the device for the
    host, the prompt under B: no hit at all (the host holds A's pages under A's keys); then under A
    again: a hit, every token of it promoted from the host; greedy tokens equal stock's throughout."""
    a, b = _tenants(kind)
    prompt, flush = workloads()["pressure"][:1], workloads(seed=1)["pressure"]
    phases = [("a", prompt, a), ("flush", flush, {}), ("b", prompt, b), ("a again", prompt, a)]
    got = {}
    for engine_name, cls, kw in (("stock", AsyncScheduler, {}),
                                 ("jenga", JengaAsyncScheduler, dict(scheduler_cls=JENGA, kv_offloading_size=HOST_GIB))):
        cfg = async_config(path, max_model_len=320, **kw)
        kv = kv_config(cfg, LAYERS["sliding"], 20)
        if cls is JengaAsyncScheduler:
            kv = attach_host_layout(cfg, [rewrite_config(kv, cfg.model_config.max_model_len)])[0]
        sched, hash_block = make_scheduler(cls, cfg, kv)
        runner = HostRunner(kv) if cls is JengaAsyncScheduler else FakeRunner(kv)
        for name, ps, extra in phases:
            mgr = getattr(sched, "jenga", None)
            before = mgr.stats() if mgr else None
            tokens, *_ = run(sched, hash_block, kv, ps, runner=runner, name=f"{name}-", extra=extra)
            after = mgr.stats() if mgr else None
            got[(engine_name, name)] = tokens, before, after
            if mgr and name == "flush":  # A's pages are on the host only now
                keys = set(requests(sched, hash_block, prompt, extra=a)[0].block_hashes)
                assert not keys & {k for t in mgr.index.table for k in t}
                assert keys & {k for t in mgr.host.index.table for k in t}
    for name, *_ in phases:
        assert got[("jenga", name)][0] == got[("stock", name)][0], name
    hits = {name: (after.prefix_hit_tokens - before.prefix_hit_tokens, after.host_hit_tokens - before.host_hit_tokens)
            for (engine_name, name), (_, before, after) in got.items() if engine_name == "jenga"}
    print(f"\n{kind}: (prefix hit, host hit) tokens per phase {hits}")
    assert hits["b"] == (0, 0)
    assert hits["a again"][0] == hits["a again"][1] > 0


def test_no_cache_salt_names_another_adapter():
    """A client's cache salt is free text: none may spell another request's (salt, adapter),
    or a base-model request would be served an adapter's pages (and learn its prompts): the salt
    of jenga's own hashes (``JengaKVCacheAdapter.cache_salt``) tells every such request apart."""
    from types import SimpleNamespace

    from jenga.vllm.adapter import JengaKVCacheAdapter

    def req(salt, lora=None, lora_id=1, path="/adapters/a"):
        adapter = None if lora is None else SimpleNamespace(lora_name=lora, lora_int_id=lora_id, lora_path=path)
        return SimpleNamespace(cache_salt=salt, lora_request=adapter)

    salt = JengaKVCacheAdapter.cache_salt
    cases = [req(None), req(""), req("t"), req(None, "a"), req("t", "a"), req("", "a"),
             req("t", "a", lora_id=2), req("t", "a", path="/adapters/a2"), req("t", "b"),
             # salts a client could send, spelling the ones above
             req("t\x00lora:a"), req("\x00lora:a"), req("\x00"), req("\x00t"),
             req(salt(req("t", "a"))), req(salt(req(None, "a")), "a")]
    salts = [salt(r) for r in cases]
    assert len(set(salts)) == len(cases), salts
    assert salts[:3] == [None, "", "t"]  # neither adapter nor images: the salt itself
