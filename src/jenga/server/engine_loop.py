"""The engine loop: one background thread owns the ``LLM`` (model, scheduler, manager).

Request handlers never touch the engine.  They :meth:`EngineLoop.submit` a
:class:`Handle` (tokens + ``SamplingParams`` + cache salt) and read :class:`Event`\\ s from
its asyncio queue; :meth:`EngineLoop.abort` (a client that went away) and
:meth:`EngineLoop.call` (an in-process check such as ``check_integrity``) are commands
too.  The thread drains its command queue, runs one ``LLM.step`` while there is work
(blocking on the queue when there is none), then publishes every request's new tokens
and finish, and refreshes the metrics.  Aborts go through the engine's public
``LLM.abort``: the request's pages are freed before the next step.

Backpressure: at most ``max_waiting`` requests may be accepted but not yet running
(waiting for their first step); :meth:`submit` raises :class:`QueueFull` beyond that, which
the app turns into a 429 with ``Retry-After``.  A step that raises aborts the requests it
had scheduled (``LLM.step``'s contract); their handlers get an error event, the loop goes on.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from jenga.errors import JengaError
from jenga.sched.sampling_params import SamplingParams
from jenga.sched.sequence import Status
from jenga.server.logprobs import entries
from jenga.server.metrics import ServerMetrics

log = logging.getLogger("jenga.server")


class QueueFull(Exception):
    """More than ``max_waiting`` requests are waiting for their first step."""


class EngineStopped(Exception):
    """The engine thread has stopped (shutdown); no request is accepted."""


@dataclass
class Event:
    """New output of one request: ``token_ids`` produced since the previous event; at the
    end ``finished`` with ``finish_reason`` and the engine's final ``text`` (cut at a stop
    string); ``error`` (and its HTTP ``status``) when the engine failed the request."""

    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    text: str = ""
    error: str | None = None
    status: int = 500
    logprobs: list = field(default_factory=list)  # jenga.server.logprobs entries of token_ids


@dataclass(eq=False)
class Handle:
    """One request's way between a handler (event loop thread) and the engine thread."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str | None
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrival: float = field(default_factory=time.monotonic)
    # engine thread only
    seq: object = None
    sent: int = 0
    first_token_at: float | None = None
    waiting: bool = True  # counted against max_waiting
    logprobs: int | None = None  # alternatives per token to report (params.return_logits is set)


class EngineLoop:
    """Drives ``llm`` in a daemon thread; see the module docstring."""

    def __init__(self, llm, metrics: ServerMetrics, *, max_waiting: int = 256, idle_poll_s: float = 0.5,
                 metrics_interval_s: float = 0.25):
        self.llm = llm
        self.metrics = metrics
        self.max_waiting = max_waiting
        self.idle_poll_s = idle_poll_s
        # the gauges' refresh (``manager.stats()``: its needed bytes cost O(held pages), 0.1 s at a
        # real model's full pool) runs at most this often while requests run, and whenever none does
        self.metrics_interval_s = metrics_interval_s
        self._observe_due = 0.0
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting = 0  # accepted, not yet scheduled once
        self._pending_adds = 0
        self._handles: dict[str, Handle] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jenga-engine", daemon=True)
        self.peak_running = 0
        self.dead = False

    # ------------------------------------------------------- any thread
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._cmds.put(("wake",))
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, handle: Handle) -> None:
        with self._lock:
            if self.dead:
                raise EngineStopped("the engine loop is not running")
            if self._waiting >= self.max_waiting:
                raise QueueFull(f"{self._waiting} requests are waiting (--max-waiting {self.max_waiting})")
            self._waiting += 1
            self._pending_adds += 1
        self._cmds.put(("add", handle))

    def abort(self, request_id: str) -> None:
        self._cmds.put(("abort", request_id))

    def call(self, fn) -> Future:
        """Run ``fn(llm)`` on the engine thread between steps; returns its future."""
        fut: Future = Future()
        self._cmds.put(("call", fn, fut))
        return fut

    # ----------------------------------------------------- engine thread
    def _run(self) -> None:
        llm = self.llm
        try:
            while not self._stop.is_set():
                self._drain(block=not llm.has_unfinished)
                error = None
                if llm.has_unfinished:
                    try:
                        llm.step()
                    except Exception as e:  # noqa: BLE001 - the step aborted what it scheduled; serve on
                        log.exception("engine step failed; its requests were aborted")
                        error = e
                self._publish(error)
                now = time.monotonic()
                full = not llm.has_unfinished or now >= self._observe_due
                if full:
                    self._observe_due = now + self.metrics_interval_s
                self._observe(full)
        finally:  # stopping, or a bug in the loop itself: no handler may wait forever
            self.dead = True
            try:
                for rid in list(self._handles):
                    llm.abort(rid)
                self._publish(RuntimeError("the engine loop stopped"))
            except Exception:  # noqa: BLE001 - the engine itself is broken; still fail the queued ones
                log.exception("could not abort the live requests")
            self._fail_pending()

    def _fail_pending(self) -> None:
        while True:
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                self._send(cmd[1], Event([], True, "abort", error="the engine loop stopped", status=503))
            elif cmd[0] == "call":
                cmd[2].set_exception(RuntimeError("the engine loop stopped"))

    def _drain(self, block: bool) -> None:
        try:
            cmd = self._cmds.get(timeout=self.idle_poll_s) if block else self._cmds.get_nowait()
        except queue.Empty:
            return
        while True:
            self._do(cmd)
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return

    def _taken(self, h) -> None:
        """``h``'s add left the command queue (called under the lock)."""
        self._pending_adds -= 1

    def _add_request(self, h):
        """Hand ``h`` to the engine; its sequence (a ``JengaError`` when the engine refuses it)."""
        return self.llm.add_request(h.prompt_token_ids, h.params, request_id=h.request_id, cache_salt=h.cache_salt)

    def _do(self, cmd: tuple) -> None:
        kind = cmd[0]
        if kind == "add":
            h = cmd[1]
            with self._lock:
                self._taken(h)
            try:
                h.seq = self._add_request(h)
            except JengaError as e:
                self._release_waiting(h)
                self._send(h, Event([], True, "abort", error=str(e), status=400))
                return
            self._handles[h.request_id] = h
        elif kind == "abort":
            self.llm.abort(cmd[1])  # published (and counted) by the next _publish
        elif kind == "call":
            fn, fut = cmd[1], cmd[2]
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(self.llm))
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(e)

    def _release_waiting(self, h: Handle) -> None:
        if h.waiting:
            h.waiting = False
            with self._lock:
                self._waiting -= 1

    def _send(self, h: Handle, ev: Event) -> None:
        try:
            h.loop.call_soon_threadsafe(h.queue.put_nowait, ev)
        except RuntimeError:  # the server's event loop is closed (shutdown)
            pass

    def _publish(self, error: Exception | None) -> None:
        now = time.monotonic()
        m = self.metrics
        done = []
        for rid, h in self._handles.items():
            seq = h.seq
            if h.waiting and (seq.status is not Status.WAITING or seq.num_computed):
                self._release_waiting(h)
            n = len(seq.output_token_ids)
            new = seq.output_token_ids[h.sent:n]
            if new and h.first_token_at is None:
                h.first_token_at = now
                m.ttft.observe(now - h.arrival)
            h.sent = n
            lps = []
            if h.logprobs is not None and new:
                lps = entries(seq.logits[-len(new):], new, h.logprobs)
                seq.logits.clear()
            if not seq.finished:
                if new:
                    self._send(h, Event(new, logprobs=lps))
                continue
            done.append(rid)
            self._release_waiting(h)
            reason = seq.finish_reason
            m.finished.labels(reason=reason).inc()
            ev = Event(new, True, reason, seq.text, logprobs=lps)
            if reason == "abort":
                m.aborted.inc()
                if error is not None:
                    ev.error = f"the engine failed this request: {error}"
                    ev.status = 400 if isinstance(error, JengaError) else 500
            elif n > 1:
                m.tpot.observe((now - h.first_token_at) / (n - 1))
            self._send(h, ev)
        for rid in done:
            del self._handles[rid]

    def _observe(self, full: bool = True) -> None:
        """The peak batch, every step; with ``full``, the gauges and counters too."""
        llm = self.llm
        sched = llm.scheduler
        running = len(sched.running)
        self.peak_running = max(self.peak_running, running)
        if full:
            self.metrics.observe_engine(llm.manager.stats(), running, len(sched.waiting) + self._pending_adds,
                                        sched.stats.preemptions)
