"""``JengaScheduler``: vLLM's scheduler with jenga as its KV-cache manager.

``vllm.LLM(..., scheduler_cls="jenga.vllm.JengaScheduler")`` (or ``--scheduler-cls`` on
the OpenAI server) is all a user adds.  With async scheduling on, the same name builds
:class:`JengaAsyncScheduler` (vLLM's ``AsyncScheduler`` underneath), so async stays on.
vLLM features jenga does not cover are refused here, at engine start, by name.
"""

from __future__ import annotations

from vllm.logger import init_logger
from vllm.v1.core.kv_cache_utils import partial_hash_hits_enabled
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from jenga.capacity import fits, max_context_tokens
from jenga.errors import InsufficientMemoryError
from jenga.vllm import compat
from jenga.vllm.adapter import JengaKVCacheAdapter
from jenga.vllm.admission import (
    HitsFirst,
    admission_name,
    manager_admission,
    manager_eviction,
    manager_eviction_options,
    reserve_prefills,
)
from jenga.vllm.junction_stop import JunctionStop, junction_stop_name
from jenga.vllm.metrics import Snapshots, startup_line
from jenga.vllm.offloading import uses_host_tier
from jenga.vllm.plan import layout_name, uniform_plan
from jenga.vllm.prefix_wait import PrefixWait, prefix_wait_name, prefix_wait_stops
from jenga.vllm.specs import UnsupportedInVllm

logger = init_logger("vllm.jenga")  # under vLLM's logger: its handlers and level

#: speculative methods verified against stock vLLM (greedy tokens, acceptance counters); None: no drafts.
#: "mtp" on attention-only targets: on Mamba hybrids vLLM's speculative state blocks are refused (specs.state_spec)
SPEC_METHODS = (None, "ngram", "draft_model", "eagle", "eagle3", "mtp")


#: why data parallelism stays refused.  A dense model's DP ranks are independent engines (vLLM sets each
#: engine core's data_parallel_size to 1 before it builds the scheduler), so this is only met by a
#: MoE model's DP engine cores, which share expert dispatch across ranks
DP_REFUSAL = ("data parallelism of MoE models (not verified against stock vLLM: vLLM 0.32's CPU build does not "
              "run it, its first step raises NotImplementedError in the CPU communicator's all_gatherv, "
              "from the naive DP/EP MoE dispatch; offline LLM(data_parallel_size=2) is refused by vLLM itself)")


def spec_method(vllm_config) -> str | None:
    """vLLM's speculative method of this engine (``None`` without speculative decoding)."""
    spec = vllm_config.speculative_config
    return None if spec is None else spec.method


def refuse_unsupported(vllm_config) -> None:
    """Raise ``UnsupportedInVllm`` naming the first vLLM feature jenga cannot serve
    (first of all, a vLLM version outside the supported range)."""
    compat.check_version()
    checks = [
        (vllm_config.kv_transfer_config is not None and not uses_host_tier(vllm_config),
         f"the KV connector {getattr(vllm_config.kv_transfer_config, 'kv_connector', None)!r} (disaggregated "
         "prefill, LMCache/NIXL transfers; host offloading is jenga's own host tier: set kv_offloading_size with "
         "the native backend)"),
        (spec_method(vllm_config) not in SPEC_METHODS,
         f"the speculative method {spec_method(vllm_config)!r} (verified against stock vLLM: "
         f"{', '.join(m for m in SPEC_METHODS if m)})"),
        (vllm_config.model_config.is_encoder_decoder, "encoder-decoder models"),
        (vllm_config.parallel_config.pipeline_parallel_size > 1 and layout_name() == "uniform",
         "pipeline parallelism in JENGA_VLLM_LAYOUT=uniform (its plan counts one stage's layers; the default "
         "page-layer layout plans every stage)"),
        (vllm_config.parallel_config.data_parallel_size > 1, DP_REFUSAL),
        (vllm_config.parallel_config.decode_context_parallel_size > 1, "decode context parallelism"),
        (vllm_config.scheduler_config.watermark > 0, "a KV-cache watermark"),
        (getattr(vllm_config.cache_config, "use_replayssm", False),
         "ReplaySSM Mamba decode kernels (they write states outside the block-table columns jenga plans)"),
        *compat.refusals(vllm_config),
    ]
    for bad, what in checks:
        if bad:
            raise UnsupportedInVllm(f"jenga.vllm does not support {what}; run without scheduler_cls="
                                    "'jenga.vllm.JengaScheduler' for it")


#: state pages one request may hold in one step: its work page, the checkpoint it copies from
#: (a hit, or the one its last step ended on), the checkpoint its previous step is still
#: writing (async scheduling) and the one this step ends on
STATE_PAGES_PER_STEP = 4


def check_max_model_len_fits(mgr, max_model_len: int, step: int = 1) -> None:
    """Refuse at engine start a budget in which one request of ``max_model_len`` tokens can
    never be allocated (vLLM's own start-time check counts vLLM's blocks, not jenga's pages);
    otherwise the scheduler would wait for memory forever.  ``step``: the most tokens one step
    computes for a request (vLLM's ``max_num_batched_tokens`` plus its speculative lookahead): a
    group holds the most pages it holds at once over steps of that size (``Footprint.peak_pages``: a
    sliding window or a chunk plus a step's tokens, not the window alone), as ``allocate_slots``
    will ask for them."""
    pages = [pol.footprint.peak_pages(max_model_len, step) for pol in mgr.policies]
    pages = [p + (STATE_PAGES_PER_STEP - 1) * (not g.spec.per_token) for p, g in zip(pages, mgr.model.groups,
                                                                                   strict=True)]
    if not fits(mgr, pages):
        longest = max_context_tokens(mgr)
        raise InsufficientMemoryError(
            f"jenga.vllm: the KV budget ({mgr.pool.num_large_pages} large pages of {mgr.large_page_bytes} B) cannot hold "
            f"one request of max_model_len={max_model_len} tokens in steps of {step} tokens (jenga's pages per "
            f"group {pages}; about {longest} tokens fit one token a step); give the KV cache more memory, or lower "
            "max_model_len or max_num_batched_tokens")


def sub_block_hits_lost(kv_cache_config, hash_block_size: int, enable_caching: bool,
                        sub_block: bool = False) -> str | None:
    """Why jenga takes fewer prefix hits than stock vLLM here, or None: with a hash block finer
    than an align-mode Mamba block (``prefix_match_unit``), stock vLLM resumes states inside
    the block by copy-on-write; jenga does too in its page-layer layout (``sub_block``: its
    pages are one hash block, ``jenga.vllm.plan.sub_block_page``), in vLLM's own layout
    (``JENGA_VLLM_LAYOUT=uniform``) its state checkpoints sit on whole blocks only."""
    if sub_block or not (enable_caching and partial_hash_hits_enabled(kv_cache_config.kv_cache_groups,
                                                                       hash_block_size)):
        return None
    blocks = sorted({g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups
                     if getattr(g.kv_cache_spec, "mamba_cache_mode", None) == "align"})
    return (f"jenga.vllm: prefix_match_unit={hash_block_size} is finer than the Mamba block {blocks}; stock vLLM "
            "takes sub-block state hits there (copy-on-write), jenga only whole-block ones in this layout: "
            "expect fewer hits")


def check_host_layout(mgr, host) -> None:
    """The workers' host buffer (``jenga_host``, computed by the plugin) addresses the pages of the
    manager's host tier exactly: same page and large-page bytes, same number of large pages."""
    pool = mgr.pool
    if (tuple(pool.page_bytes), pool.large_page_bytes, mgr.host_num_large) != (host.page_bytes, host.large_page_bytes,
                                                                               host.num_large):
        raise UnsupportedInVllm(f"jenga.vllm: the host layout {host} differs from the manager's pages "
                                f"{pool.page_bytes} / {pool.large_page_bytes} B x {mgr.host_num_large}")


class JengaScheduler(Scheduler):
    """vLLM's ``Scheduler`` whose ``kv_cache_manager`` is a jenga adapter."""

    def __new__(cls, vllm_config, *args, **kwargs):
        if cls is JengaScheduler and vllm_config.scheduler_config.async_scheduling:
            cls = JengaAsyncScheduler
        return super().__new__(cls)

    def __init__(self, vllm_config, kv_cache_config, *args, **kwargs):
        refuse_unsupported(vllm_config)
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        plan = getattr(kv_cache_config, "jenga_plan", None)
        if plan is None:
            if layout_name() != "uniform":
                raise UnsupportedInVllm(
                    "jenga.vllm: the KV-cache config has no jenga page-layer plan: the jenga vLLM plugin "
                    "(entry point 'vllm.general_plugins' -> jenga.vllm.plugin:register) did not run in the "
                    "engine core; reinstall jenga with the [vllm] extra, or set JENGA_VLLM_LAYOUT=uniform")
            plan = uniform_plan(kv_cache_config, self.max_model_len)
        host = getattr(kv_cache_config, "jenga_host", None)  # kv_offloading_size's host tier (jenga.vllm.offloading)
        if uses_host_tier(vllm_config) and host is None:
            raise UnsupportedInVllm("jenga.vllm: kv_offloading_size is set but the KV-cache config has no jenga host "
                                    "layout: the jenga vLLM plugin did not run in the engine core")
        # cached prefixes first (jenga.vllm.admission); vLLM's priority policy keeps its own order,
        # and vLLM's own cache-aware admission (0.34, opt-in) asks the adapter instead
        hits_first = (admission_name() != "fcfs" and self.policy.value == "fcfs"
                      and self.cache_config.enable_prefix_caching and not compat.cache_aware_admission(vllm_config))
        ordered = hits_first or (compat.cache_aware_admission(vllm_config) and self.policy.value == "fcfs")
        # JENGA_VLLM_PROTECT=predict: the evictor's common-prefix predictor, fed every request held and
        # finished here, handed to the manager with this scheduler's admission order and step budget
        eviction_options = manager_eviction_options(ordered, self.scheduler_config.max_num_batched_tokens)
        self.next_use = None if eviction_options is None else eviction_options.next_use
        self.kv_cache_manager = JengaKVCacheAdapter(
            plan, kv_cache_config, max_model_len=self.max_model_len, enable_caching=self.cache_config.enable_prefix_caching,
            log_stats=self.log_stats, enable_kv_cache_events=self.enable_kv_cache_events,
            hash_block_size=self.hash_block_size, host_memory_bytes=None if host is None else host.total_bytes,
            admission=manager_admission(ordered), max_step_tokens=self.scheduler_config.max_num_batched_tokens,
            eviction=manager_eviction(), eviction_options=eviction_options,
            # a junction off the Mamba block grid costs its request a step: priced (jenga.vllm.junction_stop)
            junction_stop=JunctionStop(self.cache_config.block_size, rule=junction_stop_name(),
                                       step_tokens=self.scheduler_config.max_num_batched_tokens,
                                       num_requests=lambda: len(self.requests)),
            junction_readers=lambda request, junction: self._junction_readers(request, junction),
            reserve_prefills=reserve_prefills())
        if host is not None:
            check_host_layout(self.kv_cache_manager.manager, host)
        if self.connector is not None:  # jenga's connector reads the copy plans off jenga's manager
            self.connector.bind_kv_cache_manager(self.kv_cache_manager)
        # one token a step: counting the real step (the window plus max_num_batched_tokens) refused budgets
        # the vLLM tests' stock comparisons serve; which count is exact is not settled yet
        check_max_model_len_fits(self.kv_cache_manager.manager, self.max_model_len)
        logger.info("%s", startup_line(self.kv_cache_manager.manager))
        # vLLM's scheduler read these off its own manager in __init__; with jenga's pages finer
        # than the Mamba block it ends prefill steps on jenga's hash-block checkpoints and junctions
        self.mamba_partial_cache_hit = (self.need_mamba_block_aligned_split and self.hash_block_size < self.block_size
                                        and self.kv_cache_manager.coordinator.enable_partial_hash_hits)
        self.mamba_shared_prefix_checkpoint = (self.mamba_partial_cache_hit
                                               and self.kv_cache_manager.mamba_shared_prefix_checkpoint)
        lost = sub_block_hits_lost(kv_cache_config, self.hash_block_size, self.cache_config.enable_prefix_caching,
                                   self.kv_cache_manager.sub_block)
        if lost:
            logger.warning("%s", lost)
        # jenga's gauges on vLLM's /metrics (jenga.vllm.metrics), refreshed with vLLM's own stats
        self.snapshots = Snapshots() if self.log_stats else None
        if self.snapshots is not None:
            self.snapshots.write(self.kv_cache_manager.manager, force=True)
        self.num_preemptions = 0
        # a waiting request whose prefix a step in flight computes waits for it (jenga.vllm.prefix_wait)
        wait = prefix_wait_name()
        self.prefix_wait = None
        if wait != "off" and self.cache_config.enable_prefix_caching:
            adapter = self.kv_cache_manager
            self.prefix_wait = PrefixWait(adapter.get_num_cached_tokens, adapter.writes_in_flight,
                                          step_tokens=self.scheduler_config.max_num_batched_tokens,
                                          priced=wait == "priced", usage=lambda: adapter.usage,
                                          stops_from=prefix_wait_stops())
        self._queue_stopped = False  # a held request stopped this step's admissions behind it
        self._admitted_seen = -1  # len(running) at the last look for this step's admissions (-1: none yet)
        self.admission = None
        if hits_first:
            self.admission = HitsFirst(self.kv_cache_manager.get_num_cached_tokens,
                                       window=2 * self.scheduler_config.max_num_seqs,
                                       deepest=admission_name() == "deepest-first",
                                       version=self.kv_cache_manager.cache_version)

    def add_request(self, request, *args, **kwargs) -> None:
        if self.next_use is not None and request.request_id not in self.requests:
            self.next_use.arrive(request.request_id, request.block_hashes)
        super().add_request(request, *args, **kwargs)

    def _free_request(self, request, *args, **kwargs):
        if self.next_use is not None:  # before its pages are released: they are no known future use
            self.next_use.leave(request.request_id)
        if self.prefix_wait is not None:
            self.prefix_wait.forget(request.request_id)
        return super()._free_request(request, *args, **kwargs)

    def _junction_readers(self, request, junction: int) -> int:
        """The requests other than ``request`` waiting with its prompt's first ``junction`` tokens
        (the common-prefix predictor's known future uses of a state checkpointed there; 1 without one)."""
        if self.next_use is None:
            return 1
        nu, hashes, k = self.next_use, request.block_hashes, junction // self.hash_block_size
        if not 0 < k <= len(hashes):
            return 0
        return nu.live.get(hashes[k - 1], 0) - (request.request_id in nu.waiting)

    def _handle_blocked_waiting_request(self, request) -> bool:
        """vLLM's check of a waiting request at the head of its queue (False: skipped this step),
        and jenga's: it waits while a step in flight computes its prefix, and behind a long one the
        requests wait too while the pool is pressed (``jenga.vllm.prefix_wait``)."""
        if not super()._handle_blocked_waiting_request(request):
            return False
        if self._queue_stopped:
            return False
        wait = self.prefix_wait
        if wait is None:
            return True
        self._admitted_so_far(wait)
        if wait.skips(lambda: self.kv_cache_manager.get_num_cached_tokens(request)):
            return False
        if not wait.holds(request, len(self.requests)):
            return True
        self._queue_stopped = wait.stops(request)
        return False

    def _admitted_so_far(self, wait) -> None:
        """Show ``wait`` the requests admitted this step since the last call (the tail of
        ``running``: the admission loop only appends to it), each with its readers: the waiting
        requests that will read its whole prompt (``PrefixWait.leads``)."""
        start, self._admitted_seen = self._admitted_seen, len(self.running)
        if start < 0 or self.next_use is None:
            return  # the loop's first call: its running requests were admitted before this step
        block = self.hash_block_size
        for request in self.running[start:]:
            wait.leads(request, self._junction_readers(request, request.num_prompt_tokens // block * block))

    def schedule(self, *args, **kwargs):
        self._admitted_seen = -1
        if self.prefix_wait is not None:
            self.prefix_wait.new_step()
        self._queue_stopped = False
        if self.admission is not None:
            self.admission.reorder(self.waiting)
        out = super().schedule(*args, **kwargs)
        nu = self.next_use
        if nu is not None and nu.waiting:  # admitted (or resumed) this step: no future use of what they pass
            for req in self.running:
                if req.request_id in nu.waiting:
                    nu.admitted(req.request_id)
        return out

    def make_stats(self, *args, **kwargs):
        stats = super().make_stats(*args, **kwargs)
        if self.snapshots is not None:
            self.snapshots.write(self.kv_cache_manager.manager)
        return stats

    def shutdown(self) -> None:
        super().shutdown()
        if self.snapshots is not None:
            self.snapshots.close()

    def _preempt_request(self, request, *args, **kwargs) -> None:
        self.num_preemptions += 1  # counted for tests and benchmarks; jenga frees the pages in free()
        if self.next_use is not None:  # it waits again: its prompt will be read again
            self.next_use.arrive(request.request_id, request.block_hashes)
        super()._preempt_request(request, *args, **kwargs)

    @property
    def jenga(self):
        """The jenga ``KVCacheManager`` deciding this scheduler's pages."""
        return self.kv_cache_manager.manager


class JengaAsyncScheduler(JengaScheduler, AsyncScheduler):
    """Async scheduling (tokens scheduled before their ids are sampled) with jenga."""
