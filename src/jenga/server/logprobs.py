"""Log-probabilities of generated tokens, in OpenAI's two shapes.

The engine keeps each sampled token's raw logits row (``SamplingParams.return_logits``);
the engine thread turns the new rows into ``(token, logprob, top)`` entries (log-softmax of
the model's own distribution, before temperature / top-p / top-k, as vLLM reports by default)
and frees the rows.  Handlers format them: completions' ``{"tokens", "token_logprobs",
"top_logprobs", "text_offset"}`` and chat's ``{"content": [{"token", "logprob", "bytes",
"top_logprobs"}]}``.
"""

from __future__ import annotations

import torch

Entry = tuple[int, float, list[tuple[int, float]]]


def entries(rows: list[torch.Tensor], tokens: list[int], k: int) -> list[Entry]:
    """One entry per sampled token: its logprob and the ``k`` most likely tokens' logprobs."""
    if not rows:
        return []
    lp = torch.log_softmax(torch.stack(rows).float(), dim=-1)
    chosen = lp[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()
    if k:
        vals, ids = lp.topk(k, dim=-1)
        tops = [list(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), vals.tolist(), strict=True)]
    else:
        tops = [[] for _ in tokens]
    return list(zip(tokens, chosen, tops, strict=True))


def _piece(tokenizer, tok: int) -> str:
    return tokenizer.decode([tok], skip_special_tokens=False) if tokenizer is not None else ""


def completion_logprobs(items: list[Entry], tokenizer, text_offset: int) -> dict:
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = text_offset
    for tok, lp, top in items:
        piece = _piece(tokenizer, tok)
        out["tokens"].append(piece)
        out["token_logprobs"].append(lp)
        out["top_logprobs"].append({_piece(tokenizer, t): v for t, v in top})
        out["text_offset"].append(offset)
        offset += len(piece)
    return out


def chat_logprobs(items: list[Entry], tokenizer) -> dict:
    def one(tok, lp):
        piece = _piece(tokenizer, tok)
        return {"token": piece, "logprob": lp, "bytes": list(piece.encode())}

    return {"content": [{**one(tok, lp), "top_logprobs": [one(t, v) for t, v in top]} for tok, lp, top in items]}
