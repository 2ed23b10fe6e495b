"""The FastAPI app of ``jenga serve``: OpenAI completions and chat, models, health, metrics.

:func:`create_app` wraps one ``LLM``; its engine steps in the :class:`EngineLoop` thread
started with the app.  Handlers validate (400 in OpenAI's error body, naming the field),
tokenize, enqueue and then read the request's events: all at once (``stream: false``) or
as server-sent events in OpenAI's chunk format (``stream: true``; the chunk with the finish
reason carries ``usage``, or a last choice-less chunk does when
``stream_options.include_usage``).  A client that disconnects (or closes its stream)
aborts its request through ``LLM.abort``: its pages are freed before the next step.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import ClientDisconnect

from jenga.server.engine_loop import EngineLoop, EngineStopped, Handle, QueueFull
from jenga.server.errors import APIError, error_body, install_handlers
from jenga.server.guard import Guard
from jenga.server.logprobs import chat_logprobs, completion_logprobs
from jenga.server.metrics import ServerMetrics
from jenga.server.responses import Shape, TextStream, sse, usage
from jenga.server.schemas import ChatCompletionRequest, CompletionRequest


class EventStream(StreamingResponse):
    """Server-sent events from the async generator ``Service.stream``, closed by the response
    itself once starlette is done with it, in the request's own task: its ``finally`` (which
    aborts the request of a client that went away) runs there and then, never later from the
    garbage collector's finalizer in another task (which could race a generator still running:
    "async generator already executing").  A client gone mid-stream is no server error."""

    def __init__(self, events):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.events = events

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except (ClientDisconnect, OSError):
            pass  # the client went away: ``Service.stream``'s ``finally`` aborts its request
        finally:
            await self.events.aclose()


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (nothing else reads a non-streamed request's messages)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Service:
    """What the handlers share: the engine loop, the handler-side tokenizer, the limits."""

    def __init__(self, llm, *, model_name: str, max_waiting: int, retry_after_s: int):
        self.model_name = model_name
        self.metrics = ServerMetrics([g.name for g in llm.manager.model.groups])
        self.engine = EngineLoop(llm, self.metrics, max_waiting=max_waiting)
        self.tokenizer = copy.deepcopy(llm.tokenizer)  # the engine thread keeps its own
        self.vocab = llm.config_vocab
        self.defaults = dict(llm.generation_defaults.sampling)
        self.limits = llm.limits  # the engine's own length rule (jenga.engine.request_limits)
        self.model_max_len = llm.limits.model_max_len
        self.max_len = llm.limits.max_len
        self.retry_after_s = retry_after_s

    # ---------------------------------------------------------------- inputs
    def check_model(self, name: str | None) -> None:
        if name not in (None, self.model_name):
            raise APIError(404, f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        if self.tokenizer is None:
            raise APIError(400, "this model has no tokenizer files; send the prompt as token ids",
                           param="prompt", code="no_tokenizer")
        if special or not self.tokenizer.hf:
            ids = self.tokenizer.encode(text)
        else:
            ids = list(self.tokenizer.backend(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise APIError(400, "the prompt encodes to no tokens", param="prompt", code="invalid_value")
        return ids

    def chat_prompt(self, body: ChatCompletionRequest) -> list[int]:
        tok = self.tokenizer
        template = getattr(tok.backend, "chat_template", None) if tok is not None and tok.hf else None
        if not template:
            raise APIError(400, "this model has no chat template; use /v1/completions", param="messages",
                           code="no_chat_template")
        msgs = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            text = tok.backend.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001 - a template that rejects these messages is the client's case
            raise APIError(400, f"the chat template rejected the messages: {e}", param="messages",
                           code="invalid_value") from e
        return self.encode(text, special=False)

    def check_ids(self, ids: list[int]) -> None:
        bad = next(((i, t) for i, t in enumerate(ids) if isinstance(t, bool) or not 0 <= t < self.vocab), None)
        if bad is not None:
            raise APIError(400, f"prompt token {bad[0]} is {bad[1]}; token ids must be in [0, {self.vocab})",
                           param="prompt", code="invalid_value")

    def max_tokens(self, n_prompt: int, asked: int | None, default: int | None) -> int:
        """The request's ``max_tokens``; 400 naming both lengths when the prompt (+ ``asked``) is too long."""
        limit, what = self.max_len, self.limits.describe()
        if n_prompt >= limit:
            raise APIError(400, f"{what}; the prompt has {n_prompt} tokens, leaving no room to generate",
                           param="prompt", code="context_length_exceeded")
        if asked is not None and n_prompt + asked > limit:
            raise APIError(400, f"{what}; you requested {n_prompt + asked} tokens ({n_prompt} in the prompt, "
                           f"{asked} for the completion)", param="max_tokens", code="context_length_exceeded")
        room = limit - n_prompt
        return asked if asked is not None else min(room, default or room)

    # ---------------------------------------------------------------- running
    def submit(self, ids: list[int], body, max_tokens: int, chat: bool, tenant: int | None) -> tuple[Handle, Shape]:
        params = body.sampling_params(self.defaults, max_tokens)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        salt = body.cache_salt if tenant is None else f"tenant{tenant}\x00{body.cache_salt or ''}"
        handle = Handle(rid, ids, params, salt, asyncio.get_running_loop(), logprobs=body.num_logprobs)
        try:
            self.engine.submit(handle)
        except QueueFull as e:
            raise APIError(429, f"the server is busy: {e}; retry later", code="queue_full",
                           headers={"Retry-After": str(self.retry_after_s)}) from e
        except EngineStopped as e:
            raise APIError(503, str(e), code="engine_stopped") from e
        return handle, Shape(rid, self.model_name, chat)

    async def collect(self, request: Request, handle: Handle, shape: Shape) -> dict:
        """The whole result; ``{}`` when the client disconnected first (the request is aborted)."""
        n, ev, lps = 0, None, []
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            while True:
                get = asyncio.ensure_future(handle.queue.get())
                await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    return {}
                ev = get.result()
                n += len(ev.token_ids)
                lps += ev.logprobs
                if ev.finished:
                    break
        finally:
            gone.cancel()
            if ev is None or not ev.finished:
                self.engine.abort(handle.request_id)
        if ev.error:
            raise APIError(ev.status, ev.error, code="engine_error")
        return shape.full(ev.text, ev.finish_reason, usage(len(handle.prompt_token_ids), n),
                          self.format_logprobs(handle, shape, lps, 0))

    def format_logprobs(self, handle: Handle, shape: Shape, lps: list, text_offset: int) -> dict | None:
        if handle.logprobs is None:
            return None
        if shape.chat:
            return chat_logprobs(lps, self.tokenizer)
        return completion_logprobs(lps, self.tokenizer, text_offset)

    async def stream(self, handle: Handle, shape: Shape, include_usage: bool):
        done = False
        try:
            text = TextStream(self.tokenizer, handle.params.stop)
            n = offset = 0
            if shape.chat:
                yield shape.chunk("", first=True)
            while True:
                ev = await handle.queue.get()
                n += len(ev.token_ids)
                if ev.error:
                    done = True
                    yield sse(error_body(ev.status, ev.error, None, "engine_error"))
                    break
                lps = self.format_logprobs(handle, shape, ev.logprobs, offset)
                if lps is not None and not shape.chat:
                    offset += sum(len(t) for t in lps["tokens"])
                if not ev.finished:
                    delta = text.feed(ev.token_ids)
                    if delta or lps:
                        yield shape.chunk(delta, logprobs=lps)
                    continue
                done = True
                delta = text.feed(ev.token_ids, ev.text)
                use = usage(len(handle.prompt_token_ids), n)
                if include_usage:
                    yield shape.chunk(delta, ev.finish_reason, logprobs=lps)
                    yield shape.chunk(None, use=use, no_choices=True)
                else:
                    yield shape.chunk(delta, ev.finish_reason, use=use, logprobs=lps)
                break
            yield "data: [DONE]\n\n"
        finally:
            if not done:  # the client went away (the stream was cancelled or closed)
                self.engine.abort(handle.request_id)


def create_app(llm, *, model_name: str, api_key: str | list[str] | None = None, max_waiting: int = 256,
               max_body_bytes: int = 1 << 20, retry_after_s: int = 1) -> FastAPI:
    """The app serving ``llm`` under ``model_name``; ``app.state.service`` holds the engine loop.

    ``api_key``: one key, or several (one per tenant: each tenant's prefix cache is salted
    apart from the others', on top of the request's own ``cache_salt``)."""
    keys = tuple(k for k in ([api_key] if isinstance(api_key, str) else (api_key or ())) if k)
    svc = Service(llm, model_name=model_name, max_waiting=max_waiting, retry_after_s=retry_after_s)

    @asynccontextmanager
    async def lifespan(_app):
        svc.engine.start()
        try:
            yield
        finally:
            svc.engine.stop()

    app = FastAPI(title="jenga", lifespan=lifespan)
    app.state.service = svc
    install_handlers(app)
    app.add_middleware(Guard, api_keys=keys, max_body_bytes=max_body_bytes)

    @app.get("/health")
    async def health():
        if not svc.engine.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": svc.model_name, "object": "model", "created": 0,
                                            "owned_by": "jenga", "max_model_len": svc.max_len}]}

    async def respond(request: Request, body, ids: list[int], asked: int | None, default: int | None, chat: bool):
        max_tokens = svc.max_tokens(len(ids), asked, default)
        handle, shape = svc.submit(ids, body, max_tokens, chat, getattr(request.state, "tenant", None))
        if body.stream:
            return EventStream(svc.stream(handle, shape, body.include_usage))
        result = await svc.collect(request, handle, shape)
        return result if result else Response(status_code=499)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        svc.check_model(body.model)
        prompt = body.single_prompt()
        ids = svc.encode(prompt) if isinstance(prompt, str) else list(prompt)
        svc.check_ids(ids)
        return await respond(request, body, ids, body.max_tokens, svc.defaults.get("max_tokens", 16), False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        svc.check_model(body.model)
        ids = svc.chat_prompt(body)
        return await respond(request, body, ids, body.requested_max_tokens, svc.defaults.get("max_tokens"), True)

    return app
