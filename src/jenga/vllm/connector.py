"""``JengaConnector``: jenga's host tier through vLLM's KV connector interface.

Selected by ``kv_offloading_size`` with jenga's scheduler (:mod:`jenga.vllm.offloading`) and
registered by the plugin with ``KVConnectorFactory.register_connector``.

*Scheduler side.*  jenga's manager decides everything (:mod:`jenga.core.tier`): it demotes what a
page's kind can still serve a hit with when the device evicts it, and its lookup
(``get_computed_blocks``) promotes a hit's host pages to fresh device pages under admission's rule,
jointly over every group (a state without its attention pages, or the reverse, is never a hit).
So the connector reports no external tokens (``get_num_new_matched_tokens``: the hit is already
local) and hands each step's copy plan (``KVCacheManager.take_copy_plan``, after the step's
allocations) to the workers in the step's metadata.

*Worker side.*  ``register_kv_caches`` builds :class:`~jenga.vllm.host_copies.HostPageCopies`
over the worker's KV buffer; ``handle_preemptions`` runs the step's plan (demotes, then
promotes): vLLM's model runners call it first in every step, forward or not, before the step's
block copies (a promoted state page may be copied into its block-table column) and its forward;
``start_load_kv`` has nothing left to load.  ``shutdown`` releases the host buffer.  Nothing is saved per layer or sent anywhere.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from jenga.core.tier.copy_plan import CopyPlan


class JengaCopyMetadata(KVConnectorMetadata):
    """One step's copies: ``plan`` (page ids of jenga's groups in both tiers)."""

    def __init__(self, plan: CopyPlan):
        self.plan = plan


class JengaConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM's KV connector for jenga's host tier (module doc)."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.layout = getattr(kv_cache_config, "jenga_host", None)
        self.manager = None  # scheduler side: the jenga manager (bind_kv_cache_manager)
        self.copies = None  # worker side: HostPageCopies (register_kv_caches)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: nothing is handed off when a request finishes

    # ------------------------------------------------------------------ scheduler side
    def bind_kv_cache_manager(self, kv_cache_manager) -> None:
        """vLLM binds its own manager first; ``JengaScheduler`` binds its adapter (``.manager``)."""
        super().bind_kv_cache_manager(kv_cache_manager)
        self.manager = getattr(kv_cache_manager, "manager", None)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return 0, False  # host hits are promoted by jenga's own lookup: already local

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output) -> JengaCopyMetadata:
        return JengaCopyMetadata(self.manager.take_copy_plan() if self.manager is not None else CopyPlan())

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        return False, None

    def request_finished_all_groups(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        return False, None

    # ------------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches: dict) -> None:
        from jenga.vllm.host_copies import HostPageCopies

        groups = [list(g.layer_names) for g in self._kv_cache_config.kv_cache_groups]
        self.copies = HostPageCopies(self.layout, kv_caches, groups)

    def handle_preemptions(self, kv_connector_metadata) -> None:
        if self.copies is not None:
            self.copies.execute(kv_connector_metadata.plan)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    def shutdown(self) -> None:
        if self.copies is not None:
            self.copies.release()
