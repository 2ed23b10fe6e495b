"""``benchmarks/vs_vllm_manager.py --micro``: what the timed calls do (a 128k-token add, then a
computed 100k-token request freed) and the median / max report over repeated samples."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from manager_sides import JengaSide  # noqa: E402
from vs_vllm_manager import _micro_once, budget_of, micro  # noqa: E402

from jenga.core.specs import ModelSpec  # noqa: E402

MODEL = "llama-3.1-8b"


def test_the_timed_free_releases_every_page_of_the_computed_request():
    side = JengaSide(ModelSpec.from_hf_config(MODEL, vision=False), budget_of(MODEL, None)[0])
    t_add, t_free = _micro_once(side, 8192)
    assert t_add > 0 and t_free > 0
    st = side.mgr.stats()
    assert st.used_bytes == 0 and not side.mgr.requests  # nothing held after the timed free
    side.mgr.check_integrity()
    # the freed request's pages stay cached: a re-add hits every full page below its last token
    assert side.add("again", list(range(7, 100_007))) == (100_000 - 1) // 16 * 16


def test_repeated_samples_report_the_median_and_the_largest():
    out = micro(MODEL, SimpleNamespace(memory_gib=None, no_vllm=True, budget=8192, repeat=3))
    assert out[0] == MODEL and len(out) == 3  # jenga's add and free only
    for cell in out[1:]:
        median, largest = cell.split(" (max ")
        assert 0 < float(median) <= float(largest.rstrip(")"))
    assert micro(MODEL, SimpleNamespace(memory_gib=None, no_vllm=True, budget=8192, repeat=1))[1].count("(") == 0
