"""Recurrent state under speculative decoding: drafts' mixer inputs kept, the state committed
at the accepted length.

A Mamba / Gated DeltaNet layer's state after a token cannot be undone, and a verifier may reject
any suffix of the drafts.  So the state layers never write the state after a speculative token
into a page (:mod:`jenga.engine.state`): they run those tokens one at a time (the recurrence,
``mixer.state_step``, as the target alone decodes them) from the state after the request's other
tokens, and :class:`SpeculativeStates` keeps each token's mixer input ``u`` (``[F]``, per layer and
request).  Once the verifier has kept ``keep`` drafts, :meth:`StateBindings.commit_speculative
<jenga.engine.state.StateBindings.commit_speculative>` replays the first ``keep`` inputs from the
committed state and writes the result (and any checkpoint inside) into the pages; the others are
dropped.  A request feeding speculative tokens over several forwards (the draft model's proposals,
one token per forward) replays its earlier ones first: the kept inputs are the only speculative
state there is, never a private copy of a page.

Contract: :meth:`run` is called by the forward of a step, :meth:`replay` by the commit of that
step; :meth:`clear` starts the next step (inputs of a step never outlive it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def mixer_steps(mixer, state: tuple[Tensor, ...], inputs: Sequence[Sequence[Tensor]], counts: Sequence[int],
                outputs: list[list[Tensor]] | None = None) -> tuple[Tensor, ...]:
    """Advance request ``r`` (row ``r`` of every tensor of ``state``) over its first ``counts[r]``
    inputs, one ``mixer.state_step`` per token position for the rows that have one; appends each
    output row to ``outputs[r]`` when given."""
    for t in range(max(counts, default=0)):
        sel = [r for r, c in enumerate(counts) if c > t]
        idx = torch.tensor(sel, device=state[0].device)
        whole = len(sel) == state[0].shape[0]
        sub = state if whole else tuple(s[idx] for s in state)
        y, new = mixer.state_step(torch.stack([inputs[r][t] for r in sel]), sub)
        if whole:
            state = tuple(n.to(s.dtype) for s, n in zip(state, new, strict=True))
        else:
            for s, n in zip(state, new, strict=True):
                s[idx] = n.to(s.dtype)
        if outputs is not None:
            for k, r in enumerate(sel):
                outputs[r].append(y[k])
    return state


class SpeculativeStates:
    """The mixer inputs of one step's speculative tokens, per state layer and request id."""

    def __init__(self):
        self.inputs: dict[int, dict[object, list[Tensor]]] = {}  # layer -> request id -> inputs, in order
        self.mixers: dict[int, object] = {}  # layer -> its mixer (the commit replays with it)

    def clear(self) -> None:
        self.inputs.clear()

    def run(self, layer: int, mixer, keys: Sequence[object], state: tuple[Tensor, ...],
            inputs: Sequence[Tensor]) -> list[Tensor]:
        """Outputs ``[s_r, G]`` of request ``keys[r]``'s speculative tokens ``inputs[r] [s_r, F]``
        from ``state`` (row ``r``: the state before its speculative tokens of this step's earlier
        forwards, which are replayed first); their inputs are kept."""
        self.mixers[layer] = mixer
        kept = self.inputs.setdefault(layer, {})
        earlier = [kept.get(k, []) for k in keys]
        state = mixer_steps(mixer, state, earlier, [len(e) for e in earlier])
        outs: list[list[Tensor]] = [[] for _ in keys]
        mixer_steps(mixer, state, inputs, [x.shape[0] for x in inputs], outs)
        for k, x in zip(keys, inputs, strict=True):
            kept.setdefault(k, []).extend(x.detach())
        return [torch.stack(o) for o in outs]

    def replay(self, layer: int, key: object, start: int, stop: int, state: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """``state`` (one row) advanced over request ``key``'s kept inputs ``[start, stop)`` of ``layer`` (accepted
        drafts); raises when it kept fewer (a commit of tokens no forward ran)."""
        inputs = self.inputs.get(layer, {}).get(key, [])
        if len(inputs) < stop:
            raise RuntimeError(f"request {key!r}: layer {layer} commits {stop} speculative tokens, ran {len(inputs)}")
        return mixer_steps(self.mixers[layer], state, [inputs[start:stop]], [stop - start])
