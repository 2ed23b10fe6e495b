"""OpenAI request bodies (pydantic) and their mapping to jenga's ``SamplingParams``.

Implemented fields: ``model``, ``prompt`` (a string, a token-id list, or a list of one of
them) / ``messages``, ``max_tokens`` (chat also ``max_completion_tokens``), ``temperature``,
``top_p``, ``n`` (1 only), ``stop`` (string or list, at most 4), ``seed``, ``stream``,
``stream_options.include_usage``, ``logprobs`` (completions: 0-5 alternatives; chat:
``logprobs`` + ``top_logprobs`` 0-20), ``user`` (ignored) and jenga's extras ``top_k``,
``ignore_eos``, ``cache_salt``.  Refused with a 400 naming the field: ``n > 1``,
``best_of > 1``, ``echo``, ``logit_bias``, non-zero presence / frequency penalties,
``suffix``, ``tools``, ``response_format``.  A field the request leaves out takes the model's
``generation_config.json`` value where it gives one, else OpenAI's default (temperature 1,
top-p 1, 16 tokens for completions, the rest of the context for chat).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from jenga.errors import InvalidArgumentError
from jenga.sched.sampling_params import SamplingParams
from jenga.server.errors import APIError

OPENAI_DEFAULTS = {"temperature": 1.0, "top_p": 1.0}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict | None = None
    user: str | None = None
    # jenga's extras
    top_k: int | None = None
    ignore_eos: bool = False
    cache_salt: str | None = Field(None, min_length=1)

    def _refuse_unsupported(self) -> None:
        checks = [("n", self.n != 1, "n > 1 is not supported; send n requests"),
                  ("presence_penalty", self.presence_penalty != 0.0, "presence_penalty is not supported"),
                  ("frequency_penalty", self.frequency_penalty != 0.0, "frequency_penalty is not supported"),
                  ("logit_bias", bool(self.logit_bias), "logit_bias is not supported")]
        extra = self.__pydantic_extra__ or {}
        for name in ("tools", "functions", "response_format", "suffix"):
            if extra.get(name) not in (None, [], {}):
                checks.append((name, True, f"{name} is not supported"))
        for param, bad, msg in checks:
            if bad:
                raise APIError(400, msg, param=param, code="unsupported")

    def sampling_params(self, defaults: dict, max_tokens: int) -> SamplingParams:
        """The request's ``SamplingParams``; ``defaults``: the generation config's values."""
        self._refuse_unsupported()
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > 4 or any(not s for s in stop):
            raise APIError(400, "stop: at most 4 non-empty strings", param="stop", code="invalid_value")

        def pick(name):
            value = getattr(self, name)
            if value is not None:
                return value
            return defaults.get(name, OPENAI_DEFAULTS.get(name))

        top_k = self.top_k if self.top_k is not None else defaults.get("top_k", -1)
        try:
            return SamplingParams(max_tokens=max_tokens, temperature=pick("temperature"), top_p=pick("top_p"),
                                  top_k=top_k, seed=self.seed, stop=tuple(stop), ignore_eos=self.ignore_eos,
                                  return_logits=self.num_logprobs is not None)
        except InvalidArgumentError as e:
            param = next((f for f in ("max_tokens", "temperature", "top_p", "top_k") if str(e).startswith(f)), None)
            raise APIError(400, str(e), param=param, code="invalid_value") from e

    @property
    def num_logprobs(self) -> int | None:
        """Alternatives per token to report (None: no logprobs)."""
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(None, ge=1)
    best_of: int | None = None
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    def _refuse_unsupported(self) -> None:
        super()._refuse_unsupported()
        for param, bad in (("best_of", (self.best_of or 1) > 1), ("echo", self.echo)):
            if bad:
                raise APIError(400, f"{param} is not supported", param=param, code="unsupported")

    def single_prompt(self) -> str | list[int]:
        """The one prompt of the request (a list of several is refused: send one per request)."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise APIError(400, "one prompt per request is supported; send the others separately",
                               param="prompt", code="unsupported")
            p = p[0]
        if not p:
            raise APIError(400, "prompt is empty", param="prompt", code="invalid_value")
        return p


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: only text parts are understood
            parts = []
            for part in self.content:
                if part.get("type") != "text":
                    raise APIError(400, f"content part of type {part.get('type')!r} is not supported",
                                   param="messages", code="unsupported")
                parts.append(str(part.get("text", "")))
            return "".join(parts)
        return self.content or ""


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
