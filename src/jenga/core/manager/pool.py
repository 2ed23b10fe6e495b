"""``PoolShape``: the manager's page pool as outer layers may see it (read-only).

Callers outside the core (capacity, the CLI, the server, the vLLM scheduler, baselines'
reports) ask the manager's ``pool`` for these numbers instead of reading its allocator.
``large_page_count``: how many large pages a KV budget holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from jenga.errors import InsufficientMemoryError


def large_page_count(memory_bytes: int, large_page_bytes: int) -> int:
    """Large pages a budget holds: ``floor(memory / S) - 1`` (one kept as slack); at least one."""
    num_large = memory_bytes // large_page_bytes - 1
    if num_large < 1:
        raise InsufficientMemoryError(
            f"{memory_bytes} bytes hold no large page of {large_page_bytes} bytes plus one slack "
            f"page; give at least {2 * large_page_bytes} bytes")
    return num_large


@dataclass(frozen=True)
class PoolShape:
    """The large pages a manager cuts its budget into and how each group carves them.

    ``small_per_large[g]``: small pages of group ``g`` per large page (``k_g``);
    ``page_bytes[g]``: bytes of one small page of group ``g``; ``large_page_caps``: the most
    large pages each group may own (a static partition), ``None`` when memory moves freely."""

    num_large_pages: int
    large_page_bytes: int
    small_per_large: tuple[int, ...]
    page_bytes: tuple[int, ...]
    large_page_caps: tuple[int, ...] | None = None

    @property
    def total_bytes(self) -> int:
        """Bytes of all the large pages."""
        return self.num_large_pages * self.large_page_bytes
