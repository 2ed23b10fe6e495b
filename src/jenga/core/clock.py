"""``Clock``: the manager's time, one tick per ``allocate``.

Built first and handed to the parts that read it: the ledger (the release time of what it drops,
``PageOps.now``) and the host tier (the time of a demotion, which the device's evictor triggers).
Only the manager advances it."""

from __future__ import annotations


class Clock:
    """``now``: the current tick (0 before the first ``allocate``)."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0
