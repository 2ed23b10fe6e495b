"""``benchmarks/gpu_check.sh``'s vLLM parts on a machine without CUDA: skipped by default, one clear
failure with ``GPU_CHECK_NEED_VLLM=1``; the host-tier comparison it runs (``vllm_host_gpu.py``)
exits 2 naming what is missing instead of failing inside vLLM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs these parts for real")


def _gpu_check(tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path), **env}, timeout=120)


def test_without_cuda_gpu_check_skips_or_fails_clearly(tmp_path):
    plain = _gpu_check(tmp_path)
    assert plain.returncode == 0 and "nothing to check" in plain.stdout
    need = _gpu_check(tmp_path, GPU_CHECK_NEED_VLLM="1")
    assert need.returncode == 1 and "FAILED" in need.stdout and "need one" in need.stdout


def test_host_comparison_names_what_is_missing(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import vllm_host_gpu

    assert vllm_host_gpu.main([]) == 2
    assert "cannot run here: no CUDA device is visible" in capsys.readouterr().err
