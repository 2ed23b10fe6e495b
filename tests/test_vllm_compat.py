"""``jenga.vllm.compat`` on the installed vLLM (``make test`` runs it once per version): the
supported range, the request's prefix-hit limit as this version defines it (and the adapter
honouring it on a warm cache), and 0.34's extensible KV cache turned off for jenga's engines only."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from vllm import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.request import Request
from vllm_async_driver import async_config, kv_config, layer_specs, make_scheduler, run
from vllm_support import model_dir

from jenga.vllm import JengaScheduler, compat
from jenga.vllm.plan import rewrite_config
from jenga.vllm.plugin import uses_jenga

pytestmark = pytest.mark.xdist_group("vllm-async")

PROMPT = list(range(3, 200))  # 197 tokens: six full 32-token blocks


def request(rid: str, hasher=None, **sp) -> Request:
    return Request(rid, PROMPT, SamplingParams(max_tokens=4, **sp), None, block_hasher=hasher)


def test_cache_hit_limits_through_compat():
    """compat reads the request's hit limit the way the installed version defines it."""
    plain = Request("a", list(range(3, 40)), SamplingParams(max_tokens=4), None)
    skip = Request("b", list(range(3, 40)), SamplingParams(max_tokens=4, skip_reading_prefix_cache=True), None)
    assert compat.reads_prefix_cache(plain) and compat.max_cache_hit_length(plain) == 36
    assert compat.max_cache_hit_length(plain, 20) == 20
    assert not compat.reads_prefix_cache(skip) and compat.max_cache_hit_length(skip) == 0
    if compat.MINOR >= (0, 34):  # prompt logprobs from row 10 on: at most 10 tokens come from the cache
        sp = SamplingParams(max_tokens=4, prompt_logprobs=1, prompt_logprob_start=10, skip_reading_prefix_cache=False)
        scored = Request("c", list(range(3, 40)), sp, None)
        assert compat.max_cache_hit_length(scored) == 10


def test_installed_version_is_supported_and_others_are_refused(monkeypatch):
    compat.check_version()
    monkeypatch.setattr(compat, "INSTALLED", compat.Version("0.35.0"))
    with pytest.raises(compat.UnsupportedInVllm, match=r"supports vLLM .*0\.32.*0\.35"):
        compat.check_version()


def test_pyproject_declares_the_supported_range():
    import tomllib
    from packaging.requirements import Requirement

    meta = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    reqs = [Requirement(r) for r in meta["project"]["optional-dependencies"]["vllm-cuda"]]
    assert [r.specifier for r in reqs if r.name == "vllm"] == [compat.SUPPORTED]


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A jenga scheduler that served PROMPT once (its pages stay cached)."""
    cfg = async_config(model_dir("llama", tmp_path_factory.getbasetemp()))
    cfg.scheduler_config.async_scheduling = False
    kv = rewrite_config(kv_config(cfg, 2, 64), cfg.model_config.max_model_len)
    sched, hash_block = make_scheduler(JengaScheduler, cfg, kv)
    run(sched, hash_block, kv, [PROMPT], max_tokens=2)
    hash_fn = get_hash_fn_by_name(sched.cache_config.prefix_caching_hash_algo)
    return sched.kv_cache_manager, get_request_block_hasher(hash_block, hash_fn)  # as the engine core hashes


def _hit(adapter, req: Request, bound: int | None = None) -> int:
    _, hit, _ = adapter.get_computed_blocks(req, bound)
    adapter.free(req)
    return hit


def test_adapter_honours_the_requests_hit_limit(warm):
    warm, hasher = warm
    assert _hit(warm, request("full", hasher)) == 192
    assert _hit(warm, request("bounded", hasher), 100) == 96  # the scheduler's bound, rounded down to blocks
    assert _hit(warm, request("skip", hasher, skip_reading_prefix_cache=True)) == 0
    if compat.MINOR >= (0, 34):  # prompt logprobs scored from row 70: at most 70 tokens from the cache
        scored = request("scored", hasher, prompt_logprobs=1, prompt_logprob_start=70, skip_reading_prefix_cache=False)
        assert _hit(warm, scored) == 64
    assert not warm.manager.requests and warm.manager.used_bytes == 0


def test_extensible_kv_cache_is_turned_off_for_jengas_engines_only():
    if compat.MINOR < (0, 34):
        pytest.skip("the extensible KV cache exists from vLLM 0.34 on")
    from vllm.v1.executor.abstract import Executor

    from jenga.vllm.plugin import register

    register()  # what vLLM's plugin loader does in every process
    ask = Executor.extensible_kv_cache_unsupported_reason
    jenga = SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(
        scheduler_cls="jenga.vllm.JengaScheduler")))
    assert uses_jenga(jenga.vllm_config)
    assert ask(jenga, [{"layer": object()}]) == compat.EXTENSIBLE_OFF
    stock = SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(scheduler_cls=None)))
    # stock engines get vLLM's own answer (here: the original's first check, no KV cache)
    assert ask(stock, [{}]) == "the model has no KV cache"


def test_num_cached_tokens_is_read_only(warm):
    """``get_num_cached_tokens`` (0.34's cache-aware admission, jenga's own hits-first order)
    answers what the next ``get_computed_blocks`` takes and changes nothing: no page held,
    no hit counted, no evictor key moved, the cache as it was."""
    warm, hasher = warm
    mgr = warm.manager
    def state():
        stats = mgr.stats().as_dict()
        stats.pop("num_requests")  # the probed requests' records (tokens, vLLM's hashes; no pages)
        return stats, [dict(k) for k in mgr.evictor.keys], mgr.prefix_query_tokens

    before = state()
    full = request("probe-full", hasher)
    skip = request("probe-skip", hasher, skip_reading_prefix_cache=True)
    assert [warm.get_num_cached_tokens(full) for _ in range(2)] == [192, 192]
    assert warm.get_num_cached_tokens(skip) == 0
    mgr.check_integrity()
    assert state() == before
    assert _hit(warm, full) == 192  # the probe's answer is the hit
    warm.free(skip)
    assert not mgr.requests and mgr.used_bytes == 0


def test_cache_aware_admission_reorders_through_the_adapter(tmp_path_factory):
    """vLLM 0.34's opt-in cache-aware admission runs with jenga's scheduler (jenga's own
    hits-first order steps aside): a waiting request with a cached prefix overtakes a miss."""
    from jenga.vllm.scheduler import refuse_unsupported

    if compat.MINOR < (0, 34):
        pytest.skip("cache-aware admission exists from vLLM 0.34 on")
    cfg = async_config(model_dir("llama", tmp_path_factory.getbasetemp()))
    cfg.scheduler_config.async_scheduling = False
    cfg.scheduler_config.cache_aware_admission_window = 4
    cfg.scheduler_config.cache_aware_admission_threshold = 0.0
    refuse_unsupported(cfg)
    kv = rewrite_config(kv_config(cfg, 2, 64), cfg.model_config.max_model_len)
    sched, hash_block = make_scheduler(JengaScheduler, cfg, kv)
    assert sched.admission is None and compat.cache_aware_admission(cfg)
    run(sched, hash_block, kv, [PROMPT], max_tokens=2)
    hasher = get_request_block_hasher(hash_block, get_hash_fn_by_name(sched.cache_config.prefix_caching_hash_algo))
    miss = Request("miss", list(range(300, 420)), SamplingParams(max_tokens=2), None, block_hasher=hasher)
    hit = request("hit", hasher)
    sched.add_request(miss)
    sched.add_request(hit)
    out = sched.schedule()  # admitted in the reordered queue's order
    assert [(r.req_id, r.num_computed_tokens) for r in out.scheduled_new_reqs] == [("hit", 192), ("miss", 0)]
    sched.kv_cache_manager.manager.check_integrity()


@pytest.mark.parametrize(("part", "field", "value", "named"), [
    ("speculative_config", None, SimpleNamespace(method="medusa"), "speculative method 'medusa'"),
    ("speculative_config", None, SimpleNamespace(method="dflash"), "speculative method 'dflash'"),
    ("kv_transfer_config", None, SimpleNamespace(kv_connector="NixlConnector"), "the KV connector .NixlConnector."),
    ("parallel_config", "data_parallel_size", 2, r"data parallelism of MoE models .*NotImplementedError.*all_gatherv"),
    ("model_config", "is_encoder_decoder", True, "encoder-decoder models"),
])
def test_engine_start_refuses_each_unverified_feature_by_name(tmp_path_factory, part, field, value, named):
    """n-gram, draft-model, EAGLE, EAGLE-3 and MTP speculative decoding and multimodal models start;
    what stays refused is named."""
    import copy

    from jenga.vllm.scheduler import refuse_unsupported

    cfg = copy.copy(async_config(model_dir("llama", tmp_path_factory.getbasetemp())))
    for method in ("ngram", "draft_model", "eagle", "eagle3", "mtp"):
        cfg.speculative_config = SimpleNamespace(method=method)
        refuse_unsupported(cfg)
    cfg.speculative_config = None
    real_model_config = cfg.model_config
    cfg.model_config = SimpleNamespace(is_multimodal_model=True, is_encoder_decoder=False)
    refuse_unsupported(cfg)
    cfg.model_config = real_model_config
    if part == "model_config":  # properties of the HF config: a stand-in answering the two questions
        value = SimpleNamespace(**{"is_multimodal_model": False, "is_encoder_decoder": False, field: value})
    elif field is not None:  # a copy of the config's part with the field changed
        changed = copy.copy(getattr(cfg, part))
        setattr(changed, field, value)
        value = changed
    setattr(cfg, part, value)
    with pytest.raises(compat.UnsupportedInVllm, match=named):
        refuse_unsupported(cfg)


def test_pipeline_parallelism_is_refused_in_the_uniform_layout_only(tmp_path_factory, monkeypatch):
    """The page-layer plan covers every stage's layers (``tests/test_vllm_pp_plan.py``); vLLM's own
    layout's plan counts one stage's layers, so there pipeline parallelism stays refused, by name."""
    import copy

    from jenga.vllm.scheduler import refuse_unsupported

    cfg = copy.copy(async_config(model_dir("llama", tmp_path_factory.getbasetemp())))
    cfg.parallel_config = copy.copy(cfg.parallel_config)
    cfg.parallel_config.pipeline_parallel_size = 2
    refuse_unsupported(cfg)
    monkeypatch.setenv("JENGA_VLLM_LAYOUT", "uniform")
    with pytest.raises(compat.UnsupportedInVllm, match="pipeline parallelism in JENGA_VLLM_LAYOUT=uniform"):
        refuse_unsupported(cfg)


def test_speculative_state_blocks_of_a_hybrid_are_refused_by_name():
    """Speculative decoding on a Mamba hybrid (any method, n-gram included): vLLM asks for 1 + k state
    blocks per request, which jenga's state pages do not plan (the measured end-to-end cases are in
    ``test_vllm_spec_hybrid.py`` (MTP) and the cache oracle's (n-gram))."""
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    from jenga.vllm.specs import state_spec

    for mode in ("align", "none"):
        spec = kvi.MambaSpec(block_size=96, shapes=((4,),), dtypes=(torch.bfloat16,), mamba_cache_mode=mode,
                             num_speculative_blocks=3)
        with pytest.raises(compat.UnsupportedInVllm, match=r"speculative Mamba blocks .* 1 \+ 3 state blocks"):
            state_spec(spec, "m", checkpoint_interval=96)
        assert state_spec(kvi.MambaSpec(block_size=96, shapes=((4,),), dtypes=(torch.bfloat16,),
                                        mamba_cache_mode=mode), "m", checkpoint_interval=96).state_bytes() == 8


def test_plugin_rewrites_the_planners_configs_with_this_versions_arguments(tmp_path_factory):
    """The engine core calls ``vllm.v1.engine.core.get_kv_cache_configs`` with 3 (0.32) or 4
    (0.33+) arguments; the plugin's wrapper gives jenga's engines the page-layer plan and leaves
    stock engines' configs alone."""
    import vllm.v1.engine.core as core
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

    from jenga.vllm.plugin import register

    register()
    cfg = async_config(model_dir("gemma3", tmp_path_factory.getbasetemp()))
    specs = layer_specs(cfg, [("sliding", 64)] * 5 + ["full"])
    resolve_kv_cache_layout(cfg, [["LBNHC"]], specs.values())
    memory = [64 * next(iter(specs.values())).page_size_bytes * len(specs)]
    args = [cfg, [specs], memory]
    if compat.MINOR >= (0, 33):
        from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups

        args.append(get_global_kv_cache_groups(cfg, [specs]))
    (stock,) = core.get_kv_cache_configs(*args)
    assert not hasattr(stock, "jenga_plan")
    cfg.scheduler_config.scheduler_cls = "jenga.vllm.JengaScheduler"
    (ours,) = core.get_kv_cache_configs(*args)
    assert ours.jenga_plan.layout == "pages"
    assert sorted(g.spec.kind for g in ours.jenga_plan.model.groups) == ["full", "sliding"]
