"""``SamplingParams``: how one request decodes and when it stops (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field

from jenga.errors import InvalidArgumentError


@dataclass(frozen=True)
class SamplingParams:
    """Decoding options of one request.

    * ``temperature == 0`` is greedy (top-p / top-k / seed ignored); otherwise logits are
      divided by ``temperature``, restricted to the ``top_k`` most likely tokens
      (``-1`` = all) and to the smallest set whose probability reaches ``top_p``, then sampled.
    * ``seed``: a private ``torch.Generator`` for this request (reproducible regardless of
      batching, preemption or the other requests); ``None`` uses the engine's generator.
    * The request stops after ``max_tokens`` generated tokens, on an EOS token (unless
      ``ignore_eos``), on a token in ``stop_token_ids`` or when the text ends with one of
      ``stop`` (the stop string is cut from the text unless ``include_stop_str_in_output``).
    * ``return_logits``: keep the raw logits row (fp32, CPU) of every generated token in
      :attr:`RequestOutput.logits` (for tests and debugging; costs memory).
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    return_logits: bool = False
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens must be a positive int, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise InvalidArgumentError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidArgumentError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise InvalidArgumentError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if any(not s for s in self.stop):
            raise InvalidArgumentError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
