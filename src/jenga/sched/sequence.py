"""Per-request engine state (torch-free): tokens, progress, status, finish reason.

A :class:`Sequence` mirrors what the KV-cache manager knows about the request:
``num_computed`` tokens have their K/V in the cache, ``tokens[num_computed:]`` still have to
be fed.  The scheduler moves it WAITING -> RUNNING -> FINISHED; a preemption sends it back to
WAITING with ``num_computed = 0`` and its prompt + generated tokens re-added to the manager.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from jenga.sched.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request.  ``tokens = prompt_token_ids + output_token_ids`` (kept in sync).

    ``generator`` is an opaque per-request RNG owned by the sampler (``torch.Generator``
    in the real engine, anything or None in a simulator).  ``stats`` holds counters the
    scheduler fills (``preemptions``, ``prefix_hit_tokens``, ``first_scheduled_step`` ...).
    """

    request_id: object
    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    prompt: str | None = None
    arrival: int = 0
    tokens: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    status: Status = Status.WAITING
    in_manager: bool = False
    finish_reason: str | None = None
    stop_reason: object = None
    text: str = ""
    generator: object = None
    logits: list = field(default_factory=list)
    num_preemptions: int = 0
    prefix_hit_tokens: int = 0
    cache_salt: str | None = None  # prefix-cache namespace (tenants with other salts never share)
    images: tuple = ()  # jenga ImageRefs of the prompt's images (given to the manager)
    mm: object = None  # engine-side multimodal data (pixel tensors), opaque here

    def __post_init__(self) -> None:
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.tokens = list(self.prompt_token_ids) + list(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_uncomputed(self) -> int:
        """Tokens still to feed before the next sample (prefill remainder, or 1 in decode)."""
        return len(self.tokens) - self.num_computed

    @property
    def in_prefill(self) -> bool:
        """True while more than one token is left to feed (prompt or recompute after preemption)."""
        return self.num_uncomputed > 1

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def append(self, token: int) -> None:
        self.tokens.append(token)
        self.output_token_ids.append(token)
