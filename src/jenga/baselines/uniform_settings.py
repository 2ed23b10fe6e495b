"""``UniformSettings``: which of vLLM's prefix-cache rules the ``uniform`` baseline follows.

vLLM 0.34 added settings to its v1 manager (``CacheConfig``): ``prefix_cache_retention_interval``
(sliding-window and Mamba groups keep prefix-cache entries at *semantic checkpoints*: the replay
boundary and shared-prefix junctions; a positive interval adds periodic ones; ``None`` keeps every
block), ``prefix_match_unit`` (the hash block: hits inside a hybrid model's inflated block) and
``enable_mamba_shared_prefix_checkpoint``.  The defaults here are 0.34's defaults; ``VLLM_032``
is the manager before them (one Mamba checkpoint at the prompt's last block, sliding windows
retained at the prompt's end only, no junctions).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from jenga.errors import InvalidArgumentError


@dataclass(frozen=True)
class UniformSettings:
    """vLLM's prefix-cache settings as ``uniform`` models them (module doc).

    ``retention``: ``prefix_cache_retention_interval`` in tokens (0: semantic checkpoints only;
    N > 0, a multiple of the block: also one every N tokens; ``None``: dense).
    ``match_unit``: ``prefix_match_unit`` in tokens (``None``: the block).
    ``junctions``: shared-prefix junctions are detected and retained (0.34; off: 0.32).
    ``kernel_block``: the attention kernel's smallest block (FlashAttention: 16), the alignment
    of vLLM's hybrid block formula."""

    retention: int | None = 0
    match_unit: int | None = None
    junctions: bool = True
    mamba_shared_prefix_checkpoint: bool = False
    kernel_block: int = 16

    def __post_init__(self):
        if self.retention is not None and (not isinstance(self.retention, int) or self.retention < 0):
            raise InvalidArgumentError(f"uniform: retention interval must be None or an int >= 0, not {self.retention!r}")
        if self.match_unit is not None and (not isinstance(self.match_unit, int) or self.match_unit <= 0):
            raise InvalidArgumentError(f"uniform: prefix_match_unit must be None or an int > 0, not {self.match_unit!r}")
        if not isinstance(self.kernel_block, int) or self.kernel_block <= 0:
            raise InvalidArgumentError(f"uniform: kernel_block must be an int > 0, not {self.kernel_block!r}")

    def replace(self, **changes) -> UniformSettings:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_vllm(cls, vllm_config, kv_cache_config=None) -> UniformSettings:
        """The settings of a vLLM engine config (0.34 field names; older configs give 0.32's rules)."""
        cc = vllm_config.cache_config
        if not hasattr(cc, "prefix_cache_retention_interval"):
            return VLLM_032
        return cls(retention=cc.prefix_cache_retention_interval, match_unit=cc.prefix_match_unit,
                   mamba_shared_prefix_checkpoint=bool(getattr(cc, "enable_mamba_shared_prefix_checkpoint", False)))


#: vLLM 0.32's rules (before retention intervals, junctions and ``prefix_match_unit``)
VLLM_032 = UniformSettings(retention=0, match_unit=None, junctions=False)
