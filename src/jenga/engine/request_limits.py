"""The one length rule for a request, offline (``LLM.add_request``) and on the server.

A request's prompt plus ``max_tokens`` must fit the model's maximum context and what the KV
cache holds for one request running alone (``capacity.max_context_tokens``: the scheduler's
own rule, so a request within it runs; with speculative decoding, counting the draft slots
every step holds past its tokens).  Past either, the request is refused before it
is queued, naming both lengths, instead of stopping early or failing mid-run.
"""

from __future__ import annotations

from dataclasses import dataclass

from jenga.errors import InsufficientMemoryError, SequenceTooLongError


@dataclass(frozen=True)
class RequestLimits:
    model_max_len: int
    kv_max_len: int | None  # None: unbounded (every layer keeps a window or a state)
    lookahead: int = 0  # draft slots every step holds past its tokens (speculative decoding)

    @classmethod
    def of(cls, manager, model_max_len: int, lookahead: int = 0) -> RequestLimits:
        """The limits of ``manager`` for a scheduler whose steps hold ``lookahead`` draft slots
        (``SpecScheduler.lookahead``; capped at ``model_max_len`` as it caps them)."""
        from jenga.capacity import max_context_tokens

        return cls(model_max_len, max_context_tokens(manager, lookahead=lookahead, model_max_len=model_max_len),
                   lookahead)

    @property
    def max_len(self) -> int:
        """Most tokens (prompt + output) one request may have."""
        return self.model_max_len if self.kv_max_len is None else min(self.model_max_len, self.kv_max_len)

    def describe(self) -> str:
        if self.max_len == self.model_max_len:
            return f"this model's maximum context length is {self.model_max_len} tokens"
        return f"the KV cache holds at most {self.max_len} tokens for one request (model maximum {self.model_max_len})"

    def check(self, n_prompt: int, max_tokens: int) -> None:
        """Raise unless ``n_prompt + max_tokens`` tokens fit (the server answers these with a 400)."""
        total = n_prompt + max_tokens
        if total <= self.max_len:
            return
        error = SequenceTooLongError if self.max_len == self.model_max_len else InsufficientMemoryError
        raise error(f"{self.describe()}; the request has {total} tokens ({n_prompt} in the prompt, max_tokens "
                    f"{max_tokens}); shorten the prompt or lower max_tokens")
