"""``RequestOutput``: what ``LLM.generate`` returns per prompt."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestOutput:
    """One finished request.

    ``token_ids``: generated ids (the stop token included when a stop id / EOS ended it);
    ``text``: their decoding (empty without a tokenizer; a matched stop string cut off unless
    ``include_stop_str_in_output``); ``finish_reason``: ``"stop"`` or ``"length"``;
    ``stop_reason``: the stop string or token id that matched.  ``logits``: one fp32 row per
    generated token when ``SamplingParams.return_logits``.
    """

    request_id: object
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    stop_reason: object = None
    num_preemptions: int = 0
    prefix_hit_tokens: int = 0
    logits: list = field(default_factory=list, repr=False)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
