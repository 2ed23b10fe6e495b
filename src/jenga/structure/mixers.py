"""Recurrent-state shapes per mixer kind, per tensor-parallel rank (torch-free).

``MIXERS`` maps a mixer name (what :mod:`jenga.structure.probe` recognised in the model's own module) to a
class that turns the mixer's integer parameters into state tensors, each tagged ``conv`` or ``ssm`` (the
two dtypes a caller may choose apart, and the two groups of ``split_mamba_state``).  Conv states keep the
last ``d_conv - 1`` inputs (the kernel's window minus the current token), as vLLM does.

Tensor parallelism divides heads / channels the way the model's parallel plan does: Mamba heads and inner
channels are split, Mamba-2 B/C groups are split or replicated, Gated DeltaNet key and value heads are split.
"""

from __future__ import annotations

from jenga.errors import InvalidArgumentError

__all__ = ["MIXERS", "Mixer", "div", "split_or_replicate"]

Shapes = list[tuple[str, tuple[int, ...]]]


def div(n: int, tp: int, what: str) -> int:
    if n % tp:
        raise InvalidArgumentError(f"{what} = {n} is not divisible by tp = {tp}")
    return n // tp


def split_or_replicate(n: int, tp: int, what: str) -> int:
    """Per-rank count of heads/groups: divided when possible, one replicated copy when ``n`` divides tp."""
    if n % tp == 0:
        return n // tp
    if tp % n == 0:
        return 1
    raise InvalidArgumentError(f"{what} = {n} can be neither split nor replicated across tp = {tp}")


class Mixer:
    """One mixer kind; ``params`` names the integers its state needs."""

    params: tuple[str, ...] = ()

    def shapes(self, p: dict[str, int], tp: int) -> Shapes:
        raise NotImplementedError


class Mamba1(Mixer):
    """Mamba-1 (Jamba, Falcon-Mamba): conv ``d_inner x (d_conv-1)``, SSM ``d_inner x d_state``."""

    params = ("d_inner", "d_state", "d_conv")

    def shapes(self, p, tp):
        d_inner = div(p["d_inner"], tp, "mamba d_inner")
        return [("conv", (d_inner, p["d_conv"] - 1)), ("ssm", (d_inner, p["d_state"]))]


class Mamba2(Mixer):
    """Mamba-2 (Nemotron-H, Falcon-H1, Bamba, Granite-4): conv ``(H d_head + 2 G d_state) x (d_conv-1)``,
    SSM ``H x d_head x d_state``."""

    params = ("heads", "head_dim", "groups", "d_state", "d_conv")

    def shapes(self, p, tp):
        h = div(p["heads"], tp, "mamba heads")
        g = split_or_replicate(p["groups"], tp, "mamba n_groups")
        ds = p["d_state"]
        return [("conv", (h * p["head_dim"] + 2 * g * ds, p["d_conv"] - 1)), ("ssm", (h, p["head_dim"], ds))]


class GatedDeltaNet(Mixer):
    """Gated DeltaNet (Qwen3-Next, Qwen3.5): conv ``(2 H_k d_k + H_v d_v) x (d_conv-1)``, SSM ``H_v x d_k x d_v``."""

    params = ("k_heads", "v_heads", "k_dim", "v_dim", "d_conv")

    def shapes(self, p, tp):
        hk = div(p["k_heads"], tp, "linear_num_key_heads")
        hv = div(p["v_heads"], tp, "linear_num_value_heads")
        dk, dv = p["k_dim"], p["v_dim"]
        return [("conv", (2 * hk * dk + hv * dv, p["d_conv"] - 1)), ("ssm", (hv, dk, dv))]


class Lightning(Mixer):
    """Lightning attention (MiniMax): a ``head_dim x head_dim`` state per head, no convolution."""

    params = ("heads", "head_dim")

    def shapes(self, p, tp):
        return [("ssm", (div(p["heads"], tp, "lightning heads"), p["head_dim"], p["head_dim"]))]


class ShortConv(Mixer):
    """Gated short convolution (LFM2): only a conv state ``channels x (d_conv-1)``."""

    params = ("channels", "d_conv")

    def shapes(self, p, tp):
        return [("conv", (div(p["channels"], tp, "short-conv channels"), p["d_conv"] - 1))]


class RgLru(Mixer):
    """RG-LRU (RecurrentGemma): conv ``width x (d_conv-1)`` and a ``width`` recurrent state."""

    params = ("width", "d_conv")

    def shapes(self, p, tp):
        w = div(p["width"], tp, "lru_width")
        return [("conv", (w, p["d_conv"] - 1)), ("ssm", (w,))]


MIXERS: dict[str, Mixer] = {
    "mamba1": Mamba1(),
    "mamba2": Mamba2(),
    "gated_deltanet": GatedDeltaNet(),
    # Kimi delta attention: the Gated DeltaNet shapes with H_k = H_v and d_k = d_v (q, k, v convs fused)
    "kimi_delta": GatedDeltaNet(),
    "lightning": Lightning(),
    "short_conv": ShortConv(),
    "rg_lru": RgLru(),
}
