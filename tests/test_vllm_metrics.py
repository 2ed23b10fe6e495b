"""jenga's figures for vLLM's ``/metrics`` (``jenga.vllm.metrics``) in one process: the engine
core's snapshot read back by the collector, exactly the manager's stats; a dead engine core's
snapshot is skipped.  Across processes: ``tests/test_vllm_server.py``."""

from __future__ import annotations

import json

from conftest import full, group, make_manager, model, serve, sliding
from prometheus_client import CollectorRegistry, generate_latest

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
