"""``uniform`` follows vLLM 0.34's manager: on the same seeded traces, driven by the same
scheduling loop, it gives the same hit tokens, peak blocks used and preemptions as vLLM 0.34's
real ``KVCacheManager`` (built by vLLM's own planner at the model's real layout, same blocks),
within 1 % (``benchmarks/uniform_vs_vllm034.py``: the rows and the loop).

Rows: shared few-shot prefixes and multi-turn chats over Gemma-3-12B (sliding window), long
articles with several questions each, agent sessions over Llama-3.1-8B, a shared prefix on
Jamba-1.5-Mini (Mamba hybrid, 80-token block from vLLM's formula); retention 0 (vLLM's default:
replay boundary and junction checkpoints only).  The mutants show the check sees what it guards:
``uniform`` with vLLM 0.32's rules (no junction checkpoints) and with a wrong hybrid block are
more than 1 % off.  Needs vLLM 0.34 (``.vllm-envs/0.34.0``); skipped on older versions.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from jenga.vllm.compat import MINOR

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

pytestmark = [pytest.mark.skipif(MINOR < (0, 34), reason="vLLM 0.34's manager (retention, junctions)"),
              pytest.mark.xdist_group("vllm-uniform034")]

#: rows whose three counts must agree within 1 %
AGREE = ["gemma-short-r0", "gemma-articles-r0", "llama-agent-r0", "jamba-prefix-r0"]


@pytest.mark.parametrize("row", AGREE)
def test_uniform_matches_vllm034(row):
    from uniform_vs_vllm034 import run_row, worst_gap
    res = run_row(row)
    assert res["blocks"][0] == res["blocks"][1], f"{row}: block counts differ {res['blocks']}"
    assert res["vllm"]["hit"] > 0 and res["vllm"]["peak"] > 0
    assert worst_gap(res) <= 0.01, f"{row}: vLLM {res['vllm']} vs uniform {res['uniform']}"


@pytest.mark.parametrize("row, mutant", [("gemma-short-r0", dict(junctions=False)),
                                         ("jamba-prefix-r0", dict(junctions=False)),
                                         ("jamba-prefix-r0", dict(kernel_block=32))])
def test_check_fails_on_mutant(row, mutant):
    """0.32's rules (no junction checkpoints), or a hybrid block from a wrong kernel alignment
    (96 tokens instead of vLLM's 80 on Jamba), are caught."""
    from uniform_vs_vllm034 import run_row, worst_gap
    res = run_row(row, mutant)
    assert worst_gap(res) > 0.01, f"{row} with {mutant}: vLLM {res['vllm']} vs uniform {res['uniform']}"


def test_sub_block_match_unit_refused():
    """``prefix_match_unit`` finer than a hybrid's block (vLLM's copy-on-write sub-block hits) is
    not modelled: refused by name, before any state, not silently served as whole blocks."""
    from jenga.baselines import make_manager
    from jenga.baselines.uniform_settings import UniformSettings
    from jenga.core.specs import ModelSpec
    from jenga.errors import InvalidArgumentError, UnsupportedFeatureError
    jamba = ModelSpec.from_hf_config("jamba-1.5-mini", vision=False)
    with pytest.raises(UnsupportedFeatureError, match="prefix_match_unit 16"):
        make_manager("uniform", jamba, 6 << 30, settings=UniformSettings(match_unit=16))
    with pytest.raises(InvalidArgumentError, match="retention interval 64"):
        make_manager("uniform", jamba, 6 << 30, settings=UniformSettings(retention=64))
    make_manager("uniform", jamba, 6 << 30, settings=UniformSettings(match_unit=80, retention=160))
