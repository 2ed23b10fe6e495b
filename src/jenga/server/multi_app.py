"""``jenga serve A B ...``: several models from one KV pool, routed by the OpenAI ``model`` field.

One :class:`~jenga.engine.multi_llm.MultiLLM` (one pool, one lane per model) is driven by one
engine thread (:class:`MultiEngineLoop`: an :class:`~jenga.server.engine_loop.EngineLoop` whose
adds go to the request's model).  Each model has its own :class:`ModelService` (tokenizer, length
rule, defaults: ``jenga.server.app.Service``'s handling, unchanged); a request names its model and
an unknown one gets OpenAI's 404 body naming the served models.  ``/v1/models`` lists every model;
``/metrics`` has the pool-wide metrics plus per-model ones (:mod:`jenga.server.model_metrics`).
"""

from __future__ import annotations

import copy
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from jenga.server.app import Service
from jenga.server.engine_loop import EngineLoop
from jenga.server.errors import APIError, install_handlers
from jenga.server.guard import Guard
from jenga.server.metrics import ServerMetrics
from jenga.server.model_metrics import ModelMetrics
from jenga.server.schemas import ChatCompletionRequest, CompletionRequest


class MultiEngineLoop(EngineLoop):
    """The engine loop over a ``MultiLLM``: a handle's ``model`` picks the lane it is added to."""

    def __init__(self, engine, metrics: ServerMetrics, model_metrics: ModelMetrics, **kwargs):
        super().__init__(engine, metrics, **kwargs)
        self.model_metrics = model_metrics
        self._pending_by_model: dict[str, int] = {}

    def submit_to(self, model: str, handle) -> None:
        handle.model = model
        self.submit(handle)
        with self._lock:
            self._pending_by_model[model] = self._pending_by_model.get(model, 0) + 1

    def _taken(self, h) -> None:
        super()._taken(h)
        self._pending_by_model[h.model] -= 1

    def _add_request(self, h):
        return self.llm.add_request(h.model, h.prompt_token_ids, h.params, request_id=h.request_id,
                                    cache_salt=h.cache_salt)

    def _observe(self, full: bool = True) -> None:
        lanes = list(self.llm.lanes.values())
        running = sum(len(lane.scheduler.running) for lane in lanes)
        self.peak_running = max(self.peak_running, running)
        if not full:
            return
        waiting = sum(len(lane.scheduler.waiting) for lane in lanes) + self._pending_adds
        self.metrics.observe_engine(self.llm.manager.stats(), running, waiting,
                                    sum(lane.scheduler.stats.preemptions for lane in lanes))
        self.model_metrics.observe(self.llm, dict(self._pending_by_model))


class _ModelLoop:
    """The shared engine loop as one model's service sees it: what it submits goes to its model."""

    def __init__(self, loop: MultiEngineLoop, model: str):
        self._loop, self._model = loop, model

    def submit(self, handle) -> None:
        self._loop.submit_to(self._model, handle)

    def __getattr__(self, name):
        return getattr(self._loop, name)


class ModelService(Service):
    """``Service`` for one lane of a shared pool: its tokenizer, limits and defaults; the engine
    loop is the server's one loop (``Service``'s handling of inputs and outputs, unchanged)."""

    def __init__(self, lane, loop: MultiEngineLoop, *, model_name: str, retry_after_s: int):
        self.model_name = model_name
        self.metrics = loop.metrics
        self.engine = _ModelLoop(loop, lane.name)
        self.tokenizer = copy.deepcopy(lane.tokenizer)
        self.vocab = lane.config_vocab
        self.defaults = dict(lane.generation_defaults.sampling)
        self.limits = lane.limits
        self.model_max_len = lane.limits.model_max_len
        self.max_len = lane.limits.max_len
        self.retry_after_s = retry_after_s


def create_multi_app(engine, *, api_key: str | list[str] | None = None, max_waiting: int = 256,
                     max_body_bytes: int = 1 << 20, retry_after_s: int = 1) -> FastAPI:
    """The app serving every model of ``engine`` (a ``MultiLLM``) under its lane name;
    ``app.state.service`` is the shared engine loop's holder (``.engine``, ``.metrics``, ``.models``)."""
    keys = tuple(k for k in ([api_key] if isinstance(api_key, str) else (api_key or ())) if k)
    metrics = ServerMetrics([g.name for g in engine.manager.model.groups])
    loop = MultiEngineLoop(engine, metrics, ModelMetrics(metrics.registry, engine.model_names), max_waiting=max_waiting)
    services = {name: ModelService(lane, loop, model_name=name, retry_after_s=retry_after_s)
                for name, lane in engine.lanes.items()}

    class Shared:  # what tests and tools reach through app.state.service
        pass

    shared = Shared()
    shared.engine, shared.metrics, shared.models = loop, metrics, services

    def pick(name: str | None) -> ModelService:
        svc = services.get(name)
        if svc is None:
            served = ", ".join(repr(n) for n in services)
            raise APIError(404, f"the model {name!r} does not exist; this server serves {served}", param="model",
                           code="model_not_found")
        return svc

    @asynccontextmanager
    async def lifespan(_app):
        loop.start()
        try:
            yield
        finally:
            loop.stop()

    app = FastAPI(title="jenga", lifespan=lifespan)
    app.state.service = shared
    install_handlers(app)
    app.add_middleware(Guard, api_keys=keys, max_body_bytes=max_body_bytes)

    @app.get("/health")
    async def health():
        if not loop.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics_route():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "jenga",
                                            "max_model_len": svc.max_len} for name, svc in services.items()]}

    async def respond(svc: ModelService, request: Request, body, ids, asked, default, chat: bool):
        max_tokens = svc.max_tokens(len(ids), asked, default)
        handle, shape = svc.submit(ids, body, max_tokens, chat, getattr(request.state, "tenant", None))
        if body.stream:
            return StreamingResponse(svc.stream(handle, shape, body.include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        result = await svc.collect(request, handle, shape)
        return result if result else Response(status_code=499)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        svc = pick(body.model)
        prompt = body.single_prompt()
        ids = svc.encode(prompt) if isinstance(prompt, str) else list(prompt)
        svc.check_ids(ids)
        return await respond(svc, request, body, ids, body.max_tokens, svc.defaults.get("max_tokens", 16), False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        svc = pick(body.model)
        ids = svc.chat_prompt(body)
        return await respond(svc, request, body, ids, body.requested_max_tokens, svc.defaults.get("max_tokens"), True)

    return app


def startup_lines(engine) -> list[str]:
    """What the shared pool holds, logged once at start: the budget and large page, then per model
    its groups (small page bytes and pages per large page), its floor and its longest request."""
    from jenga.units import fmt_bytes

    mgr = engine.manager
    pool = mgr.pool
    lines = [f"jenga serve: {len(engine.lanes)} models in one pool on {engine.device}: KV budget "
             f"{fmt_bytes(mgr.memory_bytes)} = {pool.num_large_pages} large pages of {fmt_bytes(pool.large_page_bytes)}"]
    for m, name in enumerate(engine.model_names):
        groups = ", ".join(f"{mgr.model.groups[g].name.split('/', 1)[1]} {fmt_bytes(pool.page_bytes[g])} x "
                           f"{pool.small_per_large[g]}" for g in mgr.scopes.groups[m])
        lines.append(f"  {name}: groups {groups}; floor {mgr.floor_pages[m]} large pages "
                     f"({fmt_bytes(mgr.model_floor_bytes(name))}); longest request {engine.lanes[name].limits.max_len} "
                     "tokens")
    return lines
