"""vLLM's own host-offloading switch, given to jenga's per-kind host tier.

``kv_offloading_size`` (``--kv-offloading-size``, GiB) makes vLLM's config select its
``OffloadingConnector`` with ``cpu_bytes_to_use`` host bytes (``VllmConfig``'s
``_post_init_kv_transfer_config``).  With jenga's scheduler the plugin selects jenga's connector
there instead (:func:`select_host_tier`, same bytes): jenga's manager then keeps a host tier
(``KVCacheManager(host_memory_bytes=...)``, :mod:`jenga.core.tier`) and the connector runs its
copy plans in vLLM's workers (:mod:`jenga.vllm.connector`).  Any other connector (LMCache, NIXL,
P/D) stays refused at engine start (``jenga.vllm.scheduler.refuse_unsupported``).

:class:`HostLayout` is the host buffer both sides agree on, derived from jenga's page-layer plan:
page ``p`` of group ``g`` is bytes ``[offset + p * P_g, offset + (p + 1) * P_g)`` of the device
buffer (``jenga.vllm.plan``) and bytes ``[p * P_g, (p + 1) * P_g)`` of the host buffer.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from jenga.core.tier.host_tier import host_page_count
from jenga.vllm.specs import UnsupportedInVllm

#: the name jenga's connector is registered under (``KVConnectorFactory.register_connector``)
CONNECTOR = "JengaHostTierConnector"
#: vLLM's native offloading connectors that ``kv_offloading_size`` selects; jenga takes their place
NATIVE = ("OffloadingConnector", "SimpleCPUOffloadConnector")
#: the extra-config key vLLM puts the host bytes under
BYTES_KEY = "cpu_bytes_to_use"
_MARK = "_jenga_wrapped"


def uses_host_tier(vllm_config) -> bool:
    """Whether this engine's KV transfer config is jenga's host tier."""
    kv = vllm_config.kv_transfer_config
    return kv is not None and kv.kv_connector == CONNECTOR


def host_bytes(vllm_config) -> int | None:
    """The host tier's bytes (``kv_offloading_size`` in bytes), or None without one."""
    if not uses_host_tier(vllm_config):
        return None
    nbytes = vllm_config.kv_transfer_config.kv_connector_extra_config.get(BYTES_KEY)
    if nbytes is None:
        raise UnsupportedInVllm(f"jenga.vllm: {CONNECTOR} without {BYTES_KEY!r} in its extra config; set "
                                "kv_offloading_size (GiB) instead of naming the connector")
    return int(nbytes)


def select_host_tier(vllm_config) -> None:
    """With jenga's scheduler and ``kv_offloading_size`` on vLLM's native backend, jenga's connector
    replaces vLLM's offloading connector (the bytes stay).  Its role is ``kv_producer``: the
    scheduler never parks a request for an external load (jenga's hits are its own lookups)."""
    from jenga.vllm.plugin import uses_jenga

    kv = vllm_config.kv_transfer_config
    if (kv is None or kv.kv_connector not in NATIVE or vllm_config.cache_config.kv_offloading_size is None
            or not uses_jenga(vllm_config)):
        return
    kv.kv_connector = CONNECTOR
    kv.kv_connector_module_path = None
    kv.kv_role = "kv_producer"


def install() -> None:
    """Register jenga's connector with vLLM's connector factory and have vLLM's config select it
    (:func:`select_host_tier`) right where it maps ``kv_offloading_size`` (idempotent)."""
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    try:
        KVConnectorFactory.register_connector(CONNECTOR, "jenga.vllm.connector", "JengaConnector")
    except ValueError:  # registered by an earlier call in this process
        pass
    original = VllmConfig._post_init_kv_transfer_config
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def post_init_kv_transfer_config(self) -> None:
        original(self)
        select_host_tier(self)

    setattr(post_init_kv_transfer_config, _MARK, True)
    VllmConfig._post_init_kv_transfer_config = post_init_kv_transfer_config


@dataclass(frozen=True)
class HostLayout:
    """The host tier's buffer: ``num_large`` large pages of ``large_page_bytes``; ``page_bytes[g]``: a
    page of group ``g`` (both tiers); ``device_offset``: where page 0 starts in the device buffer."""

    num_large: int
    large_page_bytes: int
    page_bytes: tuple[int, ...]
    device_offset: int

    @property
    def total_bytes(self) -> int:
        return self.num_large * self.large_page_bytes

    def num_pages(self, group: int) -> int:
        """Pages of ``group`` the host buffer holds."""
        return self.total_bytes // self.page_bytes[group]


def host_layout(plan, unit: int, nbytes: int) -> HostLayout:
    """The host buffer of ``nbytes`` for jenga's page-layer ``plan`` (``unit``: the bytes of one
    exec id, the KV tensors' ``block_stride``).  Raises ``InsufficientMemoryError`` when ``nbytes``
    holds no large page, ``UnsupportedInVllm`` in the uniform layout (vLLM's blocks, no page bytes)."""
    if plan.layout != "pages":
        raise UnsupportedInVllm("jenga.vllm: kv_offloading_size needs jenga's page-layer layout; unset "
                                "JENGA_VLLM_LAYOUT=uniform or run without kv_offloading_size")
    pages = tuple(s * unit for s in plan.exec_scale)
    large = math.lcm(*pages)
    try:
        n = host_page_count(nbytes, large)
    except Exception as e:  # the typed error, reworded in vLLM's terms
        raise type(e)(f"jenga.vllm: kv_offloading_size gives the host tier {nbytes} B, less than one large page "
                      f"of {large} B; give kv_offloading_size at least {large / (1 << 30):.6g} GiB") from e
    return HostLayout(n, large, pages, plan.exec_offset * unit)


def attach_host_layout(vllm_config, configs: list) -> list:
    """Every worker's rewritten config gets the host buffer's layout as ``jenga_host`` when
    ``kv_offloading_size`` selected jenga's host tier (raises at engine start, before any buffer
    exists, when those bytes hold no large page; see :func:`host_layout`)."""
    nbytes = host_bytes(vllm_config)
    if nbytes is None:
        return configs
    first = configs[0]
    layout = host_layout(first.jenga_plan, getattr(first.kv_cache_tensors[0], "block_stride", 1), nbytes)
    for cfg in configs:
        cfg.jenga_host = layout
    return configs
