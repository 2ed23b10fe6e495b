"""Prometheus metrics of a served engine (``prometheus_client``, one registry per server).

Names dashboards may rely on:

* gauges, from ``manager.stats()`` after every engine step: ``jenga_kv_total_bytes``,
  ``jenga_kv_used_bytes`` (pages held by live requests), ``jenga_kv_cached_bytes``
  (evictable prefix cache), ``jenga_kv_free_bytes``, ``jenga_kv_waste_bytes{cause=large_page |
  partial_page | out_of_window | padding}``, ``jenga_kv_group_used_bytes{group=NAME}``,
  ``jenga_requests_running``, ``jenga_requests_waiting`` (the engine's queue plus requests
  accepted but not yet handed to it);
* counters: ``jenga_prefix_query_tokens_total``, ``jenga_prefix_hit_tokens_total``,
  ``jenga_preemptions_total``, ``jenga_requests_finished_total{reason=stop | length | abort}``,
  ``jenga_request_aborted_total`` (cancelled by the client or by a failed step);
* the host-memory tier (``--host-kv-memory``; zero without it): gauges ``jenga_kv_host_total_bytes``,
  ``jenga_kv_host_used_bytes``; counters ``jenga_kv_host_promotions_total``,
  ``jenga_kv_host_demotions_total`` (pages), ``jenga_kv_host_copied_bytes_total{direction=promote |
  demote}``, ``jenga_prefix_host_hit_tokens_total`` (prompt tokens served from host pages);
* histograms: ``jenga_time_to_first_token_seconds`` (arrival at the server -> first token
  produced) and ``jenga_time_per_output_token_seconds`` (per request: first -> last token
  over the tokens after the first).

Only the engine thread writes them; ``/metrics`` reads them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

WASTE_CAUSES = {"large_page": "waste_large_page_bytes", "partial_page": "waste_partial_page_bytes",
                "out_of_window": "waste_out_of_window_bytes", "padding": "waste_padding_bytes"}
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServerMetrics:
    """The metric objects of one server, in their own registry."""

    def __init__(self, group_names: list[str]):
        self.registry = r = CollectorRegistry()
        self.kv = {k: Gauge(f"jenga_kv_{k}_bytes", f"KV cache {k} bytes", registry=r)
                   for k in ("total", "used", "cached", "free")}
        self.waste = Gauge("jenga_kv_waste_bytes", "KV bytes allocated but not needed, by cause", ["cause"],
                           registry=r)
        self.group_used = Gauge("jenga_kv_group_used_bytes", "KV bytes held by live requests, per cache group",
                                ["group"], registry=r)
        self.prefix_query = Counter("jenga_prefix_query_tokens", "prompt tokens looked up in the prefix cache",
                                    registry=r)
        self.prefix_hit = Counter("jenga_prefix_hit_tokens", "prompt tokens found in the prefix cache", registry=r)
        self.preemptions = Counter("jenga_preemptions", "requests preempted (recompute)", registry=r)
        self.host = {k: Gauge(f"jenga_kv_host_{k}_bytes", f"host KV tier {k} bytes", registry=r) for k in ("total", "used")}
        self.promotions = Counter("jenga_kv_host_promotions", "pages copied host -> device", registry=r)
        self.demotions = Counter("jenga_kv_host_demotions", "pages copied device -> host", registry=r)
        self.copied = Counter("jenga_kv_host_copied_bytes", "bytes copied between the tiers", ["direction"], registry=r)
        self.host_hit = Counter("jenga_prefix_host_hit_tokens", "prompt tokens served from the host tier",
                                registry=r)
        self.running = Gauge("jenga_requests_running", "requests in the running batch", registry=r)
        self.waiting = Gauge("jenga_requests_waiting", "requests waiting to run", registry=r)
        self.finished = Counter("jenga_requests_finished", "finished requests by reason", ["reason"], registry=r)
        self.aborted = Counter("jenga_request_aborted", "requests aborted before they finished", registry=r)
        self.ttft = Histogram("jenga_time_to_first_token_seconds", "arrival to first token", buckets=TTFT_BUCKETS,
                              registry=r)
        self.tpot = Histogram("jenga_time_per_output_token_seconds", "mean time between output tokens",
                              buckets=TPOT_BUCKETS, registry=r)
        self.group_names = group_names
        for reason in ("stop", "length", "abort"):
            self.finished.labels(reason=reason)
        self._seen = {"query": 0, "hit": 0, "preempt": 0, "promote": 0, "demote": 0, "up": 0, "down": 0,
                      "host_hit": 0}

    def observe_engine(self, stats, running: int, waiting: int, preemptions: int) -> None:
        """Refresh the gauges and move the counters from the engine's cumulative figures."""
        for k in ("total", "used", "cached", "free"):
            self.kv[k].set(getattr(stats, f"{k}_bytes"))
        for cause, field in WASTE_CAUSES.items():
            self.waste.labels(cause=cause).set(getattr(stats, field))
        for name, used in zip(self.group_names, stats.group_used_bytes, strict=True):
            self.group_used.labels(group=name).set(used)
        self.host["total"].set(stats.host_total_bytes)
        self.host["used"].set(stats.host_used_bytes)
        self.running.set(running)
        self.waiting.set(waiting)
        seen = self._seen
        for key, counter, value in (("query", self.prefix_query, stats.prefix_query_tokens),
                                    ("hit", self.prefix_hit, stats.prefix_hit_tokens),
                                    ("preempt", self.preemptions, preemptions),
                                    ("promote", self.promotions, stats.promotions),
                                    ("demote", self.demotions, stats.demotions),
                                    ("up", self.copied.labels(direction="promote"), stats.bytes_promoted),
                                    ("down", self.copied.labels(direction="demote"), stats.bytes_demoted),
                                    ("host_hit", self.host_hit, stats.host_hit_tokens)):
            if value > seen[key]:
                counter.inc(value - seen[key])
            seen[key] = value

    def render(self) -> bytes:
        return generate_latest(self.registry)
