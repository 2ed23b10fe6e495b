"""A draft and a target model share one manager and one buffer (speculative decoding)."""

from jenga.core.manager.manager import KVCacheManager
from jenga.core.specs import ModelSpec


def test_draft_and_target_share_one_pool():
    target = ModelSpec.from_hf_config("gemma-2-9b", tokens_per_page=16)
    draft = ModelSpec.from_hf_config("llama-3.2-1b", tokens_per_page=16)
    both = target.combine(draft)
    assert {g.spec.model for g in both.groups} == {target.groups[0].spec.model, draft.groups[0].spec.model}
    mgr = KVCacheManager(both, 8 << 30)
    mgr.add_request("r", list(range(5000)))
    t = mgr.allocate("r", 5000, num_lookahead=3)  # 3 speculative tokens
    assert t is not None and len(t.groups) == len(both.groups)
    draft_groups = [i for i, g in enumerate(mgr.model.groups) if g.spec.model == draft.groups[0].spec.model]
    assert draft_groups and all(len(t.groups[i].page_ids) * 16 >= 5003 for i in draft_groups)
    mgr.append_tokens("r", [1, 2])
    mgr.check_integrity()
    # a second request with the same prompt hits in both models' groups at once
    mgr.add_request("s", list(range(5000)))
    assert mgr.lookup("s") == 4992
    mgr.free("r")
    mgr.free("s")
    mgr.check_integrity()
    assert mgr.stats().used_bytes == 0


def test_layout_tells_the_two_models_layers_apart():
    target = ModelSpec.from_hf_config("llama-3.2-1b", dtype="fp32", tokens_per_page=16)
    draft = ModelSpec.from_hf_config("llama-3.2-1b", dtype="fp32", tokens_per_page=16, name="draft")
    both = target.combine(draft)
    mgr = KVCacheManager(both, 64 << 20)
    lay = mgr.layout
    a = lay.slot(0, target.groups[0].spec.model)
    b = lay.slot(0, "draft")
    assert a != b and a[0] != b[0]
