"""ASGI guard in front of the app: API key (401) and request body size (413).

With API keys every path but ``/health`` needs ``Authorization: Bearer <key>`` for one
of them (compared in constant time).  With several keys, each is a tenant: the index of the
key a request used is put in ``scope["state"]["tenant"]`` (the app salts that tenant's
prefix cache with it).  A body whose ``Content-Length`` exceeds ``max_body_bytes``
is refused before it is read; a chunked body is buffered while it arrives and refused as
soon as it passes the limit.
"""

from __future__ import annotations

import hmac
import json

from jenga.server.errors import error_body

OPEN_PATHS = frozenset({"/health"})


async def _reply(send, status: int, message: str, code: str, headers: tuple = ()) -> None:
    body = json.dumps(error_body(status, message, None, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class Guard:
    def __init__(self, app, *, api_keys: tuple[str, ...], max_body_bytes: int):
        self.app = app
        self.keys = [f"Bearer {k}".encode() for k in api_keys]
        self.max_body = max_body_bytes

    def tenant(self, auth: bytes) -> int | None:
        """Index of the key ``auth`` carries (every key compared, in constant time each)."""
        found = None
        for i, key in enumerate(self.keys):
            if hmac.compare_digest(auth, key):
                found = i
        return found

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        if self.keys and scope["path"] not in OPEN_PATHS:
            tenant = self.tenant(headers.get(b"authorization", b""))
            if tenant is None:
                return await _reply(send, 401, "missing or wrong API key (Authorization: Bearer <key>)",
                                    "invalid_api_key", ((b"www-authenticate", b"Bearer"),))
            if len(self.keys) > 1:
                scope.setdefault("state", {})["tenant"] = tenant
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            return await _reply(send, 413, f"request body of {int(length)} bytes exceeds the limit of "
                                f"{self.max_body} bytes", "body_too_large")
        if length is None and scope.get("method") in ("POST", "PUT", "PATCH"):
            receive = await self._buffer(receive, send)
            if receive is None:
                return
        await self.app(scope, receive, send)

    async def _buffer(self, receive, send):
        """Read a body of unknown length up to the limit; a receive that replays it (or None after a 413)."""
        msgs, seen = [], 0
        while True:
            msg = await receive()
            msgs.append(msg)
            if msg["type"] != "http.request":
                break
            seen += len(msg.get("body", b""))
            if seen > self.max_body:
                await _reply(send, 413, f"request body exceeds the limit of {self.max_body} bytes", "body_too_large")
                return None
            if not msg.get("more_body", False):
                break

        async def replay():
            return msgs.pop(0) if msgs else await receive()

        return replay
