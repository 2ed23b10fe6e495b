"""Per-model Prometheus metrics of a server with several models in one pool (label ``model``).

Gauges after every engine step: ``jenga_model_kv_used_bytes`` (pages the model's live requests
hold), ``jenga_model_kv_floor_bytes`` (its reserved floor), ``jenga_model_kv_waste_bytes`` (held
but not needed by its live requests), ``jenga_model_requests_running``,
``jenga_model_requests_waiting`` (its queue); counters: ``jenga_model_prefix_query_tokens_total``,
``jenga_model_prefix_hit_tokens_total``, ``jenga_model_preemptions_total``.  They live in the
server's registry beside :class:`jenga.server.metrics.ServerMetrics`' pool-wide ones.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge


class ModelMetrics:
    """The per-model metric objects, registered in ``registry``."""

    def __init__(self, registry, names: list[str]):
        r = registry
        self.names = list(names)
        self.used = Gauge("jenga_model_kv_used_bytes", "KV bytes held by the model's live requests", ["model"],
                          registry=r)
        self.floor = Gauge("jenga_model_kv_floor_bytes", "KV bytes reserved for the model", ["model"], registry=r)
        self.waste = Gauge("jenga_model_kv_waste_bytes", "KV bytes the model's live requests hold but do not need",
                           ["model"], registry=r)
        self.running = Gauge("jenga_model_requests_running", "the model's running requests", ["model"], registry=r)
        self.waiting = Gauge("jenga_model_requests_waiting", "the model's waiting requests", ["model"], registry=r)
        self.query = Counter("jenga_model_prefix_query_tokens", "prompt tokens looked up", ["model"], registry=r)
        self.hit = Counter("jenga_model_prefix_hit_tokens", "prompt tokens found cached", ["model"], registry=r)
        self.preemptions = Counter("jenga_model_preemptions", "the model's requests preempted", ["model"], registry=r)
        self._seen = {(k, n): 0 for k in ("query", "hit", "preempt") for n in names}
        for name in names:  # every model's series exists from the start, at 0
            for metric in (self.used, self.floor, self.waste, self.running, self.waiting, self.query, self.hit,
                           self.preemptions):
                metric.labels(model=name)

    def observe(self, engine, pending: dict[str, int]) -> None:
        """Refresh from a ``MultiLLM`` (``pending``: per model, requests accepted but not yet queued)."""
        mgr = engine.manager
        for m, name in enumerate(self.names):
            lane = engine.lanes[name]
            sched = lane.scheduler
            held, needed = mgr.model_needed_bytes(name)
            self.used.labels(model=name).set(mgr.model_used_bytes(name))
            self.floor.labels(model=name).set(mgr.model_floor_bytes(name))
            self.waste.labels(model=name).set(held - needed)
            self.running.labels(model=name).set(len(sched.running))
            self.waiting.labels(model=name).set(len(sched.waiting) + pending.get(name, 0))
            for key, counter, value in (("query", self.query, mgr.scopes.query_tokens[m]),
                                        ("hit", self.hit, mgr.scopes.hit_tokens[m]),
                                        ("preempt", self.preemptions, sched.stats.preemptions)):
                if value > self._seen[key, name]:
                    counter.labels(model=name).inc(value - self._seen[key, name])
                self._seen[key, name] = value
