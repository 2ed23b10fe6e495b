"""jenga's figures for vLLM's ``/metrics`` (``jenga.vllm.metrics``) in one process: the engine
core's snapshot read back by the collector, exactly the manager's stats; a dead engine core's
snapshot is skipped.  Across processes: ``tests/test_vllm_server.py``."""

from __future__ import annotations

import json

from conftest import full, group, make_manager, model, serve, sliding
from prometheus_client import CollectorRegistry, generate_latest

from jenga.core.manager.manager import KVCacheManager
from jenga.core.pagesize import with_base_page
from jenga.vllm.metrics import DIR_ENV, JengaCollector, Snapshots, startup_line


def test_snapshot_to_gauges(tmp_path, monkeypatch):
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    mgr = make_manager(model(group("full", full(), 1), group("swa", sliding(4), 1, first_layer=1)), 64)
    serve(mgr, "a", list(range(100, 120)), [1])
    serve(mgr, "b", list(range(100, 120)) + [5], [1], salt="other")
    snaps = Snapshots(interval=60)
    snaps.write(mgr)
    serve(mgr, "c", list(range(100, 120)) + [6], [1])
    snaps.write(mgr)  # within the interval: not rewritten
    f = json.loads(snaps.path.read_text())
    assert f["prefix_miss_tokens"]["other_salt"] == 20 and f["prefix_query_tokens"] == 41
    mgr.add_request("d", list(range(300, 310)))
    mgr.lookup("d")
    mgr.allocate("d", 10)  # live: bytes in use; 9 more tokens never cached
    snaps.write(mgr, force=True)
    (tmp_path / "999999999.json").write_text(snaps.path.read_text())  # no such process
    reg = CollectorRegistry()
    reg.register(JengaCollector(tmp_path))
    text = generate_latest(reg).decode()
    s, e = mgr.stats(), snaps.path.stem
    assert f'jenga_kv_pool_bytes{{engine="{e}"}} {float(s.total_bytes)}' in text
    for reason, n in s.prefix_miss_tokens.items():
        assert f'jenga_prefix_miss_tokens{{engine="{e}",reason="{reason}"}} {float(n)}' in text
    assert s.prefix_miss_tokens["other_salt"] == 20 and s.prefix_miss_tokens["never_cached"] >= 19 + 9
    for g, b in zip(("full", "swa"), s.group_used_bytes, strict=True):
        assert b > 0 and f'jenga_kv_used_bytes{{engine="{e}",group="{g}"}} {float(b)}' in text
    assert f'jenga_kv_waste_bytes{{cause="large_page",engine="{e}"}} {float(s.waste_large_page_bytes)}' in text
    assert "999999999" not in text
    snaps.close()  # the engine core shut down, its process lives on (an in-process LLM)
    assert f'engine="{e}"' not in generate_latest(reg).decode()
    assert "jenga active" in startup_line(mgr) and f"pool {mgr.alloc.num_large} large pages" in startup_line(mgr)


def test_host_tier_gauges(tmp_path, monkeypatch):
    """With a host tier (vLLM's ``kv_offloading_size``): host bytes per group and kind, pages
    demoted and promoted, host hit tokens, exactly the manager's stats; the start-up line names it."""
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    spec = model(group("full", full(), 1), group("swa", sliding(4), 1, first_layer=1))
    lp = with_base_page(spec, 1).large_page_bytes
    mgr = KVCacheManager(spec, 81 * lp, tokens_per_page=1, fit_pages=False, window_slack=0, eviction="lru",
                         host_memory_bytes=256 * lp)
    for i in range(4):  # each prompt alone fills most of the device: the earlier ones are demoted
        serve(mgr, f"r{i}", list(range(100 * i + 10, 100 * i + 40)), [1])
        mgr.take_copy_plan()
    serve(mgr, "again", list(range(10, 40)) + [7], [1])  # the first prompt again: promoted from the host
    mgr.take_copy_plan()
    snaps = Snapshots(interval=60)
    snaps.write(mgr, force=True)
    reg = CollectorRegistry()
    reg.register(JengaCollector(tmp_path))
    text = generate_latest(reg).decode()
    s, e = mgr.stats(), snaps.path.stem
    assert s.demotions > 0 and s.promotions > 0 and s.host_hit_tokens > 0, s
    assert f'jenga_host_pool_bytes{{engine="{e}"}} {float(s.host_total_bytes)}' in text
    assert f'jenga_host_demoted_pages{{engine="{e}"}} {float(s.demotions)}' in text
    assert f'jenga_host_promoted_pages{{engine="{e}"}} {float(s.promotions)}' in text
    assert f'jenga_host_hit_tokens{{engine="{e}"}} {float(s.host_hit_tokens)}' in text
    per_group = mgr.host.group_used_bytes()
    assert sum(per_group) == s.host_used_bytes > 0
    for g, b in zip(mgr.model.groups, per_group, strict=True):
        assert f'jenga_host_used_bytes{{engine="{e}",group="{g.name}",kind="{g.spec.kind}"}} {float(b)}' in text
    assert "host tier (kv_offloading_size): 256 large pages" in startup_line(mgr)
    snaps.close()
