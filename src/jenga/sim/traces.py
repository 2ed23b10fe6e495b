"""JSONL request traces: :func:`load_jsonl` reads one, :func:`dump_jsonl` writes one.

One JSON object per line, in the form :meth:`jenga.sim.workloads.SimRequest.to_dict` produces;
:func:`load_jsonl` returns a :class:`~jenga.sim.workloads.Workload` sorted by arrival.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from jenga.sim.workloads import InvalidRequestError, SimRequest, Workload, WorkloadInfo


class TraceFormatError(ValueError):
    """A JSONL trace line is malformed; the message starts with ``path:line:``."""


_JSONL_KEYS = {"request_id", "arrival", "arrival_s", "prompt_len", "output_len", "prefix_id", "prefix_len",
               "images"}


def _parse_line(obj: object, index: int) -> SimRequest:
    if not isinstance(obj, dict):
        raise InvalidRequestError(f"expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _JSONL_KEYS)
    if unknown:
        raise InvalidRequestError(f"unknown keys {unknown}; allowed: {sorted(_JSONL_KEYS)}")
    missing = [k for k in ("prompt_len", "output_len") if k not in obj]
    if "arrival" not in obj and "arrival_s" not in obj:
        missing.insert(0, "arrival")
    if missing:
        raise InvalidRequestError(f"missing keys {missing}")
    images = obj.get("images") or []
    if not isinstance(images, list) or not all(isinstance(im, list) and len(im) == 3 for im in images):
        raise InvalidRequestError(f"images must be a list of [offset, num_tokens, content_hash], got {images!r}")
    prefix_id = obj.get("prefix_id")
    arrival = obj.get("arrival", obj.get("arrival_s"))
    if isinstance(arrival, bool) or not isinstance(arrival, (int, float)):
        raise InvalidRequestError(f"arrival must be a number, got {arrival!r}")
    return SimRequest(str(obj.get("request_id", f"req-{index}")), float(arrival), obj["prompt_len"],
                      obj["output_len"], None if prefix_id is None else str(prefix_id),
                      obj.get("prefix_len", 0), tuple((o, n, h) for o, n, h in images))


def load_jsonl(path: str | Path) -> Workload:
    """Read a trace: one JSON object per line with ``arrival`` (seconds; or ``arrival_s``),
    ``prompt_len``, ``output_len`` and optional ``request_id`` (default ``req-<index>``),
    ``prefix_id``, ``prefix_len``, ``images`` (list of ``[offset, num_tokens, content_hash]``).
    Blank lines and lines starting with ``#`` are skipped.  Requests are returned stably sorted
    by arrival.  Raises ``TraceFormatError("path:line: ...")`` on the first bad line,
    including duplicate request ids, and ``FileNotFoundError`` for a missing file."""
    path = Path(path)
    reqs: list[SimRequest] = []
    seen: dict[str, int] = {}
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                req = _parse_line(json.loads(text), len(reqs))
            except json.JSONDecodeError as e:
                raise TraceFormatError(f"{path}:{lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
            except (InvalidRequestError, TypeError, ValueError) as e:
                raise TraceFormatError(f"{path}:{lineno}: {e}") from None
            if req.request_id in seen:
                raise TraceFormatError(f"{path}:{lineno}: duplicate request_id {req.request_id!r} "
                                       f"(first on line {seen[req.request_id]})")
            seen[req.request_id] = lineno
            reqs.append(req)
    reqs.sort(key=lambda r: r.arrival_s)
    return Workload(reqs, WorkloadInfo(f"jsonl:{path.name}", params={"path": str(path)}))


def dump_jsonl(requests: Iterable[SimRequest], path: str | Path) -> None:
    """Write ``requests`` in the format :func:`load_jsonl` reads (floats round-trip exactly)."""
    with Path(path).open("w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps(r.to_dict()) + "\n")
