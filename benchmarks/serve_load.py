"""Load and fault test of ``jenga serve`` (loopback only, bounded in count and time).

Starts the server in this process on a free 127.0.0.1 port, then drives it with concurrent
clients (asyncio + the official ``openai`` async client):

* ``--requests`` completions (token-id prompts with shared prefixes, greedy or seeded
  sampling, streamed or not), at most ``--concurrency`` in flight;
* about ``--cancel-frac`` of them cancelled at a random point: before their first token
  (the client task is cancelled while the prefill runs) or mid-stream (the stream is
  closed after a random number of chunks);
* ``--vanish`` clients that send a streaming request over a raw socket and reset the
  connection without reading or closing properly;
* a burst of ``--burst`` requests at once, past ``--max-waiting``: the excess must get 429
  (burst requests are not retried; the others retry a 429 after its ``Retry-After``).

At the end it checks: no crash, no error or traceback in the server's log, every completed request's text and token count equal an
offline ``LLM.generate`` of the same prompt and parameters, ``jenga_kv_used_bytes`` is 0
once idle and the manager's ``check_integrity()`` holds (run on the engine thread); and it
prints requests/s, p50/p99 time to first token (client side, streamed requests), the peak
of running requests and the 429 count.  Exit status 1 if any check fails.

    python benchmarks/serve_load.py                   # 1,000 requests (a few minutes on 2 cores)
    python benchmarks/serve_load.py --requests 40 --burst 12 --vanish 3   # the make-test size
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

import jenga
from jenga import SamplingParams
from jenga.server.app import create_app
from jenga.server.launch import BackgroundServer

MODEL = "tiny"


@dataclass
class Job:
    prompt: list[int]
    max_tokens: int
    seed: int | None  # None: greedy
    stream: bool
    cancel: str | None = None  # None | "prefill" | "stream"
    cancel_after: int = 0
    text: str | None = None
    tokens: int = 0
    ttft: float | None = None
    outcome: str = "pending"  # done | cancelled | rejected | error
    rejections: int = 0  # 429s received
    error: str = ""

    def params(self) -> SamplingParams:
        if self.seed is None:
            return SamplingParams(max_tokens=self.max_tokens)
        return SamplingParams(max_tokens=self.max_tokens, temperature=0.8, top_p=0.95, seed=self.seed)

    def body(self) -> dict:
        b = dict(model=MODEL, prompt=self.prompt, max_tokens=self.max_tokens, stream=self.stream)
        b.update(temperature=0.0) if self.seed is None else b.update(temperature=0.8, top_p=0.95, seed=self.seed)
        return b


@dataclass
class Tally:
    jobs: list[Job] = field(default_factory=list)
    vanished: int = 0


def make_jobs(n: int, rng: random.Random, cancel_frac: float, max_tokens: int) -> list[Job]:
    prefixes = [[rng.randrange(3, 512) for _ in range(rng.choice((16, 32, 48)))] for _ in range(4)]
    jobs = []
    for _ in range(n):
        tail = [rng.randrange(3, 512) for _ in range(rng.randrange(4, 80))]
        prompt = (rng.choice(prefixes) + tail) if rng.random() < 0.6 else tail
        job = Job(prompt, rng.randrange(1, max_tokens + 1), rng.randrange(1 << 20) if rng.random() < 0.3 else None,
                  stream=rng.random() < 0.6)
        if rng.random() < cancel_frac:
            job.cancel = "stream" if rng.random() < 0.6 else "prefill"
            job.stream = job.cancel == "stream" or job.stream
            job.cancel_after = rng.randrange(0, max(1, job.max_tokens // 2) + 1)
        jobs.append(job)
    return jobs


async def run_job(client: openai.AsyncOpenAI, job: Job, rng: random.Random, retries: int = 0) -> None:
    """One request; a 429 is retried after its Retry-After up to ``retries`` times (then: rejected)."""
    for attempt in range(retries + 1):
        try:
            return await _attempt(client, job, rng)
        except openai.RateLimitError as e:
            job.rejections += 1
            if attempt == retries:
                job.outcome = "rejected"
                return
            await asyncio.sleep(float(e.response.headers.get("retry-after", "1")) * rng.uniform(0.5, 1.0))


async def _attempt(client: openai.AsyncOpenAI, job: Job, rng: random.Random) -> None:
    t0 = time.perf_counter()
    try:
        if job.cancel == "prefill":
            task = asyncio.ensure_future(client.completions.create(**job.body()))
            await asyncio.sleep(rng.uniform(0, 0.02))
            if task.done():  # finished before we could cancel it: a completed request after all
                r = task.result()
                if job.stream:
                    job.text, job.outcome = "", "cancelled"
                    await r.close()
                    return
                job.text, job.tokens, job.outcome = r.choices[0].text, r.usage.completion_tokens, "done"
                return
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            job.outcome = "cancelled"
            return
        if not job.stream:
            r = await client.completions.create(**job.body())
            job.text, job.tokens, job.outcome = r.choices[0].text, r.usage.completion_tokens, "done"
            return
        stream = await client.completions.create(**job.body())
        parts, n = [], 0
        async for chunk in stream:
            if chunk.choices:
                if job.ttft is None:
                    job.ttft = time.perf_counter() - t0
                parts.append(chunk.choices[0].text)
                n += 1
            if chunk.usage is not None:
                job.tokens = chunk.usage.completion_tokens
            if job.cancel == "stream" and n > job.cancel_after:
                await stream.close()
                job.outcome = "cancelled"
                return
        job.text, job.outcome = "".join(parts), "done"
    except openai.RateLimitError:
        raise
    except openai.APIError as e:
        job.outcome, job.error = "error", f"{type(e).__name__}: {e}"


async def vanish(host: str, port: int, job: Job) -> None:
    """A client that sends a streaming request and resets the connection without reading."""
    body = json.dumps({**job.body(), "stream": True}).encode()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()
    await asyncio.sleep(0.01)
    writer.transport.abort()


def metrics(url: str) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            out[key] = s.value
    return out


async def drive(srv: BackgroundServer, jobs: list[Job], args, rng: random.Random, tally: Tally) -> None:
    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
    sem = asyncio.Semaphore(args.concurrency)

    async def limited(job):
        async with sem:
            await run_job(client, job, rng, retries=args.retries)

    burst, rest = jobs[:args.burst], jobs[args.burst:]
    await asyncio.gather(*(run_job(client, j, rng) for j in burst))  # all at once: past --max-waiting
    vanishers = [Job(j.prompt, j.max_tokens, None, True) for j in rest[:args.vanish]]
    tasks = [asyncio.ensure_future(limited(j)) for j in rest]
    for v in vanishers:
        await vanish(srv.host, srv.port, v)
        tally.vanished += 1
    await asyncio.gather(*tasks)
    await client.close()


def wait_idle(url: str, timeout: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(url)
        idle = m["jenga_requests_running"] == 0 and m["jenga_requests_waiting"] == 0
        if (idle and m["jenga_kv_used_bytes"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


def check_outputs(jobs: list[Job], args) -> list[str]:
    ref = jenga.LLM(args.model, kv_memory=args.kv_memory, seed=args.seed)
    done = [j for j in jobs if j.outcome == "done"]
    outs = ref.generate([j.prompt for j in done], [j.params() for j in done])
    bad = []
    for j, o in zip(done, outs, strict=True):
        if j.text != o.text or j.tokens != len(o.token_ids):
            bad.append(f"prompt of {len(j.prompt)} tokens: server {j.text!r} ({j.tokens}) != offline {o.text!r} "
                       f"({len(o.token_ids)})")
    return bad


class ServerLog(logging.Handler):
    """The server's log records at ERROR or with a traceback (uvicorn's "Exception in ASGI
    application", asyncio's unhandled task or async-generator errors, jenga's own)."""

    LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "asyncio", "starlette", "fastapi", "jenga")

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.bad: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.levelno >= logging.ERROR:
            self.bad.append(self.format(record))

    def __enter__(self) -> ServerLog:
        for name in self.LOGGERS:
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeHandler(self)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default="tiny-gemma3")
    ap.add_argument("--kv-memory", default="16MiB")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--cancel-frac", type=float, default=1 / 3)
    ap.add_argument("--vanish", type=int, default=20, help="clients that reset their connection")
    ap.add_argument("--burst", type=int, default=96, help="requests sent at once (past --max-waiting)")
    ap.add_argument("--max-waiting", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--retries", type=int, default=50, help="429 retries of a request outside the burst")
    ap.add_argument("--time-limit", type=float, default=900, help="seconds for the load phase")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    jobs = make_jobs(args.requests, rng, args.cancel_frac, args.max_tokens)
    llm = jenga.LLM(args.model, kv_memory=args.kv_memory, max_num_seqs=args.max_num_seqs, seed=args.seed)
    app = create_app(llm, model_name=MODEL, max_waiting=args.max_waiting)
    tally = Tally(jobs)
    failures = []
    # the log handler goes on after uvicorn's Config (its logging config replaces the handlers of its loggers)
    with BackgroundServer(app) as srv, ServerLog() as log:
        t0 = time.perf_counter()
        try:
            asyncio.run(asyncio.wait_for(drive(srv, jobs, args, rng, tally), args.time_limit))
        except asyncio.TimeoutError:
            failures.append(f"load phase passed --time-limit {args.time_limit}s")
        wall = time.perf_counter() - t0
        m = wait_idle(srv.url)
        try:
            srv.service.engine.call(lambda e: e.manager.check_integrity()).result(30)
        except AssertionError as e:
            failures.append(f"check_integrity: {e}")
        peak = srv.service.engine.peak_running
        if not srv.service.engine.alive:
            failures.append("the engine thread died")
    if m["jenga_kv_used_bytes"] != 0:
        failures.append(f"jenga_kv_used_bytes is {m['jenga_kv_used_bytes']:.0f} once idle (leak)")
    count = {k: sum(j.outcome == k for j in jobs) for k in ("done", "cancelled", "rejected", "error", "pending")}
    failures += [f"request error: {j.error}" for j in jobs if j.outcome == "error"][:5]
    if count["pending"]:
        failures.append(f"{count['pending']} requests never finished")
    if args.burst > args.max_waiting + args.max_num_seqs and not count["rejected"]:
        failures.append("a burst past --max-waiting got no 429")
    failures += check_outputs(jobs, args)[:5]
    if log.bad:
        failures.append(f"{len(log.bad)} error(s) or traceback(s) in the server log; the first:\n{log.bad[0]}")
    ttfts = sorted(j.ttft for j in jobs if j.ttft is not None and j.outcome == "done")
    q = statistics.quantiles(ttfts, n=100) if len(ttfts) >= 2 else [float("nan")] * 99
    rows = [("requests sent", args.requests + tally.vanished), ("completed (checked vs offline)", count["done"]),
            ("cancelled by the client", count["cancelled"]), ("vanished clients", tally.vanished),
            ("rejected with 429 (burst, not retried)", count["rejected"]),
            ("429s in all (others retried)", sum(j.rejections for j in jobs)), ("errors", count["error"]),
            ("aborted (server count)", int(m["jenga_request_aborted_total"])),
            ("requests/s (all handled)", f"{(args.requests + tally.vanished) / wall:.1f}"),
            ("completed requests/s", f"{count['done'] / wall:.1f}"),
            ("TTFT p50 / p99 (streamed, ms)", f"{1e3 * q[49]:.0f} / {1e3 * q[98]:.0f}"),
            ("peak running", peak), ("kv used bytes once idle", int(m["jenga_kv_used_bytes"])),
            ("server log errors / tracebacks", len(log.bad)),
            ("wall (s)", f"{wall:.1f}")]
    width = max(len(r[0]) for r in rows)
    print(f"serve_load: {args.model}, {args.kv_memory} KV, --max-num-seqs {args.max_num_seqs}, "
          f"--max-waiting {args.max_waiting}, concurrency {args.concurrency}")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    for f in failures:
        print(f"FAIL: {f}")
    print("OK" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
