"""Run the app with uvicorn: in the foreground (``jenga serve``) or in a background thread
on a free loopback port (tests, ``benchmarks/serve_load.py``)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


class BackgroundServer:
    """``with BackgroundServer(app) as srv: srv.url ...``: uvicorn on ``host``:free port in a thread."""

    def __init__(self, app, host: str = "127.0.0.1", *, log_level: str = "warning"):
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def service(self):
        return self.app.state.service

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; a typed one-line error when the port is taken."""
    from jenga.errors import InvalidArgumentError

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise InvalidArgumentError(f"cannot listen on {host}:{port}: {e.strerror or e}; pick another --port "
                                   "(or stop what is using it)") from None
    return sock


def serve_forever(app, sock: socket.socket, log_level: str = "info") -> None:
    """uvicorn on an already bound socket (``bind``)."""
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5)
    uvicorn.Server(config).run(sockets=[sock])
