"""The junction: a state hit below the cached attention prefix shares that prefix (recompute under shared pages).

On a hybrid model a lookup's hit is the longest prefix *every* group can resume from; a state
group resumes only at a checkpoint, so its hit ``h`` may lie below the *junction* ``j``, where
the prefix the full-attention groups hold in the index ends (typically the second request of a
shared few-shot prefix: the first did not know where the next would branch off, so no state
exists there).  The tokens ``[h, j)`` are recomputed for the state layers.  Without more, the
full-attention groups recompute them too, into fresh pages that duplicate cached ones (waste by
the benchmark's definition).  Instead, when the engine allows it, each full-attention group
holds the cached pages of ``[0, j)`` (a hit of ``j`` for that group alone) and its
``TokenTable.write_from`` is ``j``: the engine computes tokens ``[h, j)`` (their queries read the
cached K/V) but writes no K/V below ``write_from``.

Whether the engine allows it is per state kind, by class: ``Policy.recompute_under_shared``
(jenga's ``MambaPolicy``: its engine skips those writes, ``engine/model_runner.py``; vLLM's
``CopyForwardMambaPolicy`` and the ``uniform`` baseline: no, vLLM's model runner writes every
computed token).  Every group that is not full attention must allow it (a sliding group would
need the same engine contract; it keeps today's rule).  ``Junction`` is the manager's part for it.
"""

from __future__ import annotations

from jenga.core.policy.base import PageOps, Policy
from jenga.core.request import Request


def fixed_point(req: Request, cand: int, policies: list[Policy], ops: PageOps, bound: Policy | None = None) -> int:
    """The longest prefix no longer than ``cand`` that every one of ``policies`` accepts, the pages
    seen through ``ops``; ``bound``: a full-attention policy with all its pages below ``cand`` cached
    (``PromptHasher.for_lookup``).  The lookup's hit and the junction are both this fixed point."""
    while True:
        start = cand
        for pol in policies:
            cand = cand // pol.tpp * pol.tpp if pol is bound else pol.longest_prefix(req, cand, ops)
        if cand == start:
            return cand


class Junction:
    """``policies``: the full-attention policies, when a state or sliding group needs the junction
    (where the cached full-attention prefix ends) for its checkpoints or window retention, else
    ``None``; ``ahead``: the groups holding ``[0, junction)`` past a state hit.  ``ops``: the device's
    pages (the ledger), where the junction is found; ``bound`` the prompt hasher's bound policy."""

    def __init__(self, policies: list[Policy], block: int, caching: bool, bound: Policy | None, ops: PageOps):
        self.block, self.bound, self.ops = block, bound, ops
        full = [p for p in policies if p.bounds_hit]
        partial = any(p.needs_junction for p in policies)
        self.policies = full if full and partial else None
        others = [p for p in policies if not p.bounds_hit and not p.per_image]
        share = self.policies is not None and all(p.recompute_under_shared for p in others)
        self.ahead = frozenset(p.gi for p in full) if share and caching else frozenset()

    def find(self, req: Request, top: int, cand: int) -> None:
        """``req.junction``: where the full-attention groups' cached prefix ends, if past the hit.

        ``top`` is what ``PromptHasher.for_lookup`` returned (``jenga.core.prefix.index``): it already found
        where the bounding full-attention group's cached pages end (the first missing page's
        start, else ``top``), so with that group the only junction policy the junction is ``top``
        rounded down to its pages, without looking the prompt's page keys up again."""
        policies = self.policies
        req.junction_checkpoint = None
        if policies is not None:
            if len(policies) == 1 and policies[0] is self.bound:
                tpp = policies[0].tpp
                junction = top // tpp * tpp
            else:
                junction = fixed_point(req, top, policies, self.ops)
            req.junction = junction // self.block * self.block if junction > cand else 0

    def hit_of(self, pol: Policy, req: Request) -> int:
        """The tokens group ``pol`` holds cached pages for after a lookup (its ``hit`` length)."""
        if pol.gi in self.ahead and req.junction > req.hit:
            return req.junction
        return req.hit
