"""``TierView``: the page operations a lookup's policies see when a host tier exists.

A policy answers ``longest_prefix`` and ``hit`` from ``index_table`` / ``find`` and takes the hit
with ``hold`` / ``hold_run`` (:class:`jenga.core.policy.base.PageOps`).  Through this view the
index of each group is the device's and the host's together (a key in either tier counts), host
pages appear as negative ids (``~page``) and holds are only recorded, so the manager learns which
host pages the longest hit over both tiers needs (joint consistency: every group's pages lie in
some tier) without changing anything on the host.  It offers only what a lookup's policies call
(``index_table``, ``find``, ``hold``, ``hold_run``, and for a sliding hit ``age_keys`` with the
clock it reads), not the device ledger's other operations.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Iterator, Mapping

from jenga.core.manager.ledger import PageLedger


class _HostIds(Mapping):
    """A host index read with its pages as ``~page`` (never a device id)."""

    def __init__(self, table: dict[bytes, int]):
        self.table = table

    def __getitem__(self, key: bytes) -> int:
        return ~self.table[key]

    def __contains__(self, key: object) -> bool:
        return key in self.table

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)


class TierView:
    """Device and host index as one, holds recorded (module doc)."""

    def __init__(self, device: PageLedger, host_tables: list[dict[bytes, int]]):
        self.device = device
        self.host = [_HostIds(t) for t in host_tables]
        self.held: list[tuple[int, int]] = []  # (group, page): device pages >= 0, host pages as ~page

    # what a policy's ``hit`` reads of the device ledger besides the index (a sliding hit ages
    # the device's earlier windows, ``SlidingPolicy.hit``)
    caching = property(lambda self: self.device.caching)
    now = property(lambda self: self.device.now)
    out_of_window_age = property(lambda self: self.device.out_of_window_age)

    def age_keys(self, group: int, keys: list[bytes], ends, stamp: int, max_uses: int | None = None) -> None:
        """The device ledger's ``age_keys`` (host pages keep their keys)."""
        self.device.age_keys(group, keys, ends, stamp, max_uses)

    def index_table(self, group: int) -> ChainMap:
        return ChainMap(self.device.index_table(group), self.host[group])

    def find(self, group: int, key: bytes) -> int | None:
        page = self.device.find(group, key)
        if page is None and key in self.host[group]:
            return self.host[group][key]
        return page

    def hold(self, group: int, page: int) -> None:
        self.held.append((group, page))

    def hold_run(self, group: int, pages: list[int]) -> None:
        self.held.extend((group, page) for page in pages)

    def split(self) -> tuple[list[tuple[int, int]], dict[int, list[int]]]:
        """(host pages the recorded hit needs as (group, page), device pages it holds per group)."""
        host = [(g, ~p) for g, p in self.held if p < 0]
        device: dict[int, list[int]] = {}
        for g, p in dict.fromkeys(self.held):
            if p >= 0:
                device.setdefault(g, []).append(p)
        return host, device


class DeviceHitView(TierView):
    """The device tier alone, read only: a hit's holds are recorded and nothing is aged (the pages
    of the device's own hit, which a promotion must keep, ``jenga.core.tier.promotion``)."""

    def __init__(self, device: PageLedger):
        super().__init__(device, [{} for _ in device.ref])

    def age_keys(self, group: int, keys: list[bytes], ends, stamp: int, max_uses: int | None = None) -> None:
        pass
