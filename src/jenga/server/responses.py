"""OpenAI response bodies and stream chunks, and the incremental text of a request.

:class:`TextStream` turns a request's token events into text deltas that never show what
the final text will not contain: it holds back the last ``len(longest stop string) - 1``
characters (a stop string may be starting there) and a trailing incomplete UTF-8 character
(``\\ufffd``); at the end it emits the rest of the engine's final text, which is cut at the
stop string.  The concatenated deltas equal the non-streamed text.
"""

from __future__ import annotations

import json
import time

FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


class TextStream:
    def __init__(self, tokenizer, stop: tuple[str, ...]):
        self.tok = tokenizer
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.emitted = 0

    def feed(self, token_ids: list[int], final_text: str | None = None) -> str:
        """The new text after ``token_ids``; ``final_text`` (the engine's) at the end."""
        self.ids.extend(token_ids)
        if final_text is not None:
            delta = final_text[self.emitted:]
            self.emitted = len(final_text)
            return delta
        if self.tok is None:
            return ""
        text = self.tok.decode(self.ids)
        end = len(text) - self.hold
        while end > 0 and text[end - 1] == "\ufffd":
            end -= 1
        if end <= self.emitted:
            return ""
        delta = text[self.emitted:end]
        self.emitted = end
        return delta


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Shape:
    """Bodies of one response (``chat`` or plain completion) with its id, model and time."""

    def __init__(self, request_id: str, model: str, chat: bool):
        self.id, self.model, self.chat = request_id, model, chat
        self.created = int(time.time())

    def _base(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, text: str, finish_reason: str | None, use: dict, logprobs: dict | None = None) -> dict:
        reason = FINISH.get(finish_reason, finish_reason)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                      "finish_reason": reason}
            return {**self._base("chat.completion"), "choices": [choice], "usage": use}
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": reason}
        return {**self._base("text_completion"), "choices": [choice], "usage": use}

    def chunk(self, text: str | None, finish_reason: str | None = None, *, first: bool = False,
              use: dict | None = None, no_choices: bool = False, logprobs: dict | None = None) -> str:
        """One server-sent event (``data: {...}``)."""
        reason = FINISH.get(finish_reason, finish_reason)
        if self.chat:
            body = self._base("chat.completion.chunk")
            delta = {"role": "assistant", "content": text or ""} if first else (
                {"content": text} if text else {})
            choices = [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason}]
        else:
            body = self._base("text_completion")
            choices = [{"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": reason}]
        body["choices"] = [] if no_choices else choices
        if use is not None:
            body["usage"] = use
        return sse(body)


def sse(body: dict | str) -> str:
    data = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
    return f"data: {data}\n\n"
