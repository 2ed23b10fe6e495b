"""Progress of long CLI runs: a live bar on a terminal, a plain line every few seconds elsewhere.

``progress(desc, total)`` is a context manager with ``update(n)``.  On a terminal (stderr is a
TTY) it is a transient tqdm bar.  Otherwise (CI logs, ``| tee``, a notebook, stdout redirected
to a file) a background thread prints ``jenga: <desc> <done>/<total> <unit>, <elapsed> s`` to
stderr every ``JENGA_PROGRESS_EVERY`` seconds (default 5), so a long run is never silent;
a run shorter than that prints nothing.  stdout stays clean for ``--json``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO

DEFAULT_EVERY_S = 5.0


def progress_every() -> float:
    """Seconds between plain progress lines (``JENGA_PROGRESS_EVERY``, default 5)."""
    try:
        return max(0.01, float(os.environ.get("JENGA_PROGRESS_EVERY", DEFAULT_EVERY_S)))
    except ValueError:
        return DEFAULT_EVERY_S


class ProgressLine:
    """Prints ``<prefix>: <desc> <done>/<total> <unit>, <elapsed> s`` to ``stream`` every
    ``every`` seconds from a daemon thread, and one last line on exit if any was printed."""

    def __init__(self, desc: str, total: int | None = None, *, unit: str = "requests", every: float | None = None,
                 stream: TextIO | None = None, prefix: str = "jenga", enabled: bool = True):
        self.desc, self.total, self.unit, self.prefix = desc, total, unit, prefix
        self.every = progress_every() if every is None else every
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.lines = 0
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.enabled = enabled  # False: count only, print nothing (a terminal run showing its own lines)

    def update(self, n: int = 1) -> None:
        self.done += n

    def line(self) -> str:
        count = f"{self.done}/{self.total}" if self.total is not None else f"{self.done}"
        what = " ".join(x for x in (self.desc.strip(), count, self.unit) if x)
        return f"{self.prefix}: {what}, {time.monotonic() - self._t0:.0f} s"

    def _say(self) -> None:
        print(self.line(), file=self.stream, flush=True)
        self.lines += 1

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._say()

    def __enter__(self) -> ProgressLine:
        self._t0 = time.monotonic()
        if not self.enabled:
            return self
        self._thread = threading.Thread(target=self._run, name=f"progress {self.desc}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.lines and exc[0] is None:
            self._say()  # the final count


def progress(desc: str, total: int | None = None, *, unit: str = "requests", prefix: str = "jenga"):
    """A tqdm bar on a terminal, else a :class:`ProgressLine` (both: context manager + ``update``)."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False)
    return ProgressLine(desc, total, unit=unit, prefix=prefix)
