"""jenga's figures inside vLLM: one start-up log line and gauges on vLLM's ``/metrics``.

vLLM's scheduler runs in the engine-core process (a child of the API server unless
``VLLM_ENABLE_V1_MULTIPROCESSING=0``), while ``/metrics`` is served from the API server's
Prometheus registry; ``SchedulerStats`` has no field for a scheduler's own figures.  So the
figures travel the way ``prometheus_client``'s multiprocess mode moves values between
processes, through files: the engine core's :class:`Snapshots` writes one small JSON file
(at most once per ``interval`` seconds, atomically renamed) in ``JENGA_VLLM_METRICS_DIR``
(created by the plugin in the first vLLM process and inherited by its children), and
:class:`JengaCollector`, registered by the plugin in every process's default registry, reads
the files of live engine cores when ``/metrics`` is scraped.  In one process the same path
works unchanged.

Gauges (label ``engine``: the engine core's pid): ``jenga_kv_pool_bytes``,
``jenga_kv_used_bytes{group}``, ``jenga_kv_cached_bytes``, ``jenga_kv_waste_bytes{cause}``,
``jenga_prefix_hit_tokens``, ``jenga_prefix_query_tokens`` and
``jenga_prefix_miss_tokens{reason}`` (since start; reasons in
:mod:`jenga.core.manager.miss_reasons`); with a host tier (``kv_offloading_size``,
:mod:`jenga.vllm.offloading`): ``jenga_host_pool_bytes``, ``jenga_host_used_bytes{group,kind}``,
``jenga_host_demoted_pages``, ``jenga_host_promoted_pages`` and ``jenga_host_hit_tokens`` (since start).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from jenga.units import fmt_bytes

DIR_ENV = "JENGA_VLLM_METRICS_DIR"

WASTE = ("large_page", "partial_page", "out_of_window", "padding", "duplicate")


def startup_line(mgr) -> str:
    """``jenga active: groups ..., large page ..., pool ...`` for the engine core's log."""
    pool = mgr.pool
    groups = ", ".join(f"{g.name} ({len(g.layers)} layers, page {fmt_bytes(pb)})"
                       for g, pb in zip(mgr.model.groups, pool.page_bytes, strict=True))
    return (f"jenga active: KV-cache manager {type(mgr).__name__}; groups: {groups}; large page "
            f"{fmt_bytes(pool.large_page_bytes)}; pool {pool.num_large_pages} large pages "
            f"({fmt_bytes(pool.total_bytes)})" + host_part(mgr))


def host_part(mgr) -> str:
    """The start-up line's host tier (``kv_offloading_size`` inside vLLM), empty without one."""
    if mgr.host is None:
        return ""
    return (f"; host tier (kv_offloading_size): {mgr.host_num_large} large pages "
            f"({fmt_bytes(mgr.host.total_bytes)}), {mgr.host.policy} demotion")


def metrics_dir() -> Path:
    """The snapshot folder of this vLLM process tree (made here if no parent made it)."""
    path = os.environ.get(DIR_ENV)
    if not path:
        path = os.environ[DIR_ENV] = tempfile.mkdtemp(prefix="jenga-vllm-metrics-")
    return Path(path)


def figures(mgr) -> dict:
    """What the gauges show, from ``mgr.stats()``."""
    s = mgr.stats()
    return dict(
        pool_bytes=s.total_bytes, cached_bytes=s.cached_bytes,
        used_bytes={g.name: b for g, b in zip(mgr.model.groups, s.group_used_bytes, strict=True)},
        waste_bytes=dict(zip(WASTE, (s.waste_large_page_bytes, s.waste_partial_page_bytes,
                                     s.waste_out_of_window_bytes, s.waste_padding_bytes, s.waste_duplicate_bytes),
                             strict=True)),
        prefix_hit_tokens=s.prefix_hit_tokens, prefix_query_tokens=s.prefix_query_tokens,
        prefix_miss_tokens=dict(s.prefix_miss_tokens), host=host_figures(mgr, s))


def host_figures(mgr, s) -> dict | None:
    """The host tier's gauges (None without one): bytes per group (with its page kind), pages
    demoted and promoted, hit tokens the host served."""
    if mgr.host is None:
        return None
    return dict(pool_bytes=s.host_total_bytes, demoted_pages=s.demotions, promoted_pages=s.promotions,
                hit_tokens=s.host_hit_tokens,
                used_bytes=[(g.name, g.spec.kind, b) for g, b in zip(mgr.model.groups, mgr.host.group_used_bytes(),
                                                                      strict=True)])


class Snapshots:
    """The engine core's side: ``write(mgr)`` at most once per ``interval`` seconds."""

    def __init__(self, interval: float = 1.0):
        self.interval = interval
        self.path = metrics_dir() / f"{os.getpid()}.json"
        self.last = -interval

    def write(self, mgr, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(figures(mgr)))
        os.replace(tmp, self.path)

    def close(self) -> None:
        """The engine core shut down: its gauges leave ``/metrics`` (its process may live on)."""
        self.path.unlink(missing_ok=True)
        self.path.with_suffix(".tmp").unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class JengaCollector:
    """A ``prometheus_client`` collector over the live engine cores' snapshots."""

    def __init__(self, folder: Path):
        self.folder = folder

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        fams = {
            "pool": GaugeMetricFamily("jenga_kv_pool_bytes", "jenga's KV pool", labels=["engine"]),
            "used": GaugeMetricFamily("jenga_kv_used_bytes", "bytes held by live requests, per cache group",
                                      labels=["engine", "group"]),
            "cached": GaugeMetricFamily("jenga_kv_cached_bytes", "evictable prefix-cache bytes", labels=["engine"]),
            "waste": GaugeMetricFamily("jenga_kv_waste_bytes", "allocated bytes no live request reads, by cause",
                                       labels=["engine", "cause"]),
            "hit": GaugeMetricFamily("jenga_prefix_hit_tokens", "prompt tokens served from the cache since start",
                                     labels=["engine"]),
            "query": GaugeMetricFamily("jenga_prefix_query_tokens", "prompt tokens looked up since start",
                                       labels=["engine"]),
            "miss": GaugeMetricFamily("jenga_prefix_miss_tokens", "prompt tokens a hit could have covered and did "
                                      "not, by reason, since start", labels=["engine", "reason"]),
        }
        host = {
            "pool": GaugeMetricFamily("jenga_host_pool_bytes", "jenga's host tier (kv_offloading_size)",
                                      labels=["engine"]),
            "used": GaugeMetricFamily("jenga_host_used_bytes", "host-tier bytes holding pages, per cache group",
                                      labels=["engine", "group", "kind"]),
            "demoted": GaugeMetricFamily("jenga_host_demoted_pages", "pages copied device -> host since start",
                                         labels=["engine"]),
            "promoted": GaugeMetricFamily("jenga_host_promoted_pages", "pages copied host -> device since start",
                                          labels=["engine"]),
            "hit": GaugeMetricFamily("jenga_host_hit_tokens", "prompt tokens the host tier served since start",
                                     labels=["engine"]),
        }
        for path in sorted(self.folder.glob("*.json")):
            if not path.stem.isdigit() or not _alive(int(path.stem)):
                continue
            try:
                f = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being replaced
            e = path.stem
            fams["pool"].add_metric([e], f["pool_bytes"])
            fams["cached"].add_metric([e], f["cached_bytes"])
            fams["hit"].add_metric([e], f["prefix_hit_tokens"])
            fams["query"].add_metric([e], f["prefix_query_tokens"])
            for name, b in f["used_bytes"].items():
                fams["used"].add_metric([e, name], b)
            for cause, b in f["waste_bytes"].items():
                fams["waste"].add_metric([e, cause], b)
            for reason, n in f["prefix_miss_tokens"].items():
                fams["miss"].add_metric([e, reason], n)
            h = f.get("host")
            if h:
                for key in ("pool", "demoted", "promoted", "hit"):
                    host[key].add_metric([e], h[{"pool": "pool_bytes", "demoted": "demoted_pages",
                                                 "promoted": "promoted_pages", "hit": "hit_tokens"}[key]])
                for name, kind, b in h["used_bytes"]:
                    host["used"].add_metric([e, name, kind], b)
        return list(fams.values()) + list(host.values())


_registered = False


def register_collector() -> None:
    """Add :class:`JengaCollector` to this process's default registry (once)."""
    global _registered
    if _registered:
        return
    from prometheus_client import REGISTRY

    REGISTRY.register(JengaCollector(metrics_dir()))
    _registered = True
