"""A lookup with a host tier: the longest hit over both tiers, its host pages promoted first.

``promote_hit`` runs the lookup's own steps (hash what a hit can reach, the fixed point over every
group, the junction, each policy's ``hit``) through a ``TierView``, where a key in either tier
counts and host pages come back as ``~page``: joint consistency across groups holds over the two
tiers together (a hit is only as long as every group finds its pages in some tier).  The host
pages that hit needs, and the pages of images the request shows (found at allocate, so promoted
now: ``TierRules.side_keys``), are copied to the device (``HostTier.promote``); the lookup that
follows then finds the whole hit on the device and holds it as usual.  Nothing of the request's
record changes here.
"""

from __future__ import annotations

from jenga.core.request import Request
from jenga.core.tier.host_tier import HostTier
from jenga.core.tier.tier_view import DeviceHitView, TierView


def _record_hit(lookup, req: Request, top: int, view: TierView) -> int:
    """The longest hit of ``req`` (at most ``top`` tokens) over what ``view`` sees, its pages
    recorded in ``view``; ``req``'s record is left as it was.  Returns the hit's length."""
    policies, hasher, junction = lookup.policies, lookup.hasher, lookup.junction
    reach = hasher.for_lookup(req, top, view)
    cand = lookup.fixed_point(req, reach, policies, hasher.bound, view)
    saved_junction = req.junction
    junction.find(req, reach, cand)
    req.hit = cand
    for pol, gs in zip(policies, req.groups, strict=True):
        pol.hit(req, gs, junction.hit_of(pol, req), view)
    req.groups = [pol.state_type() for pol in policies]
    req.hit, req.junction = 0, saved_junction
    return cand


def promote_hit(lookup, host: HostTier, req: Request, top: int, quota_of=None) -> int:
    """Promote the host pages of ``req``'s longest hit over both tiers (at most ``top`` tokens)
    for ``lookup`` (a ``PrefixLookup``) under the admission rule ``quota_of`` (``HostTier.promote``);
    records the tokens that adds to the device's own hit with ``host.note_hit``.  The pages of the
    device's own hit are held too while the promotion takes device pages: a promotion that stops
    short (the device cannot give a group a page) never costs the lookup the hit the device alone
    had (a sliding window's pages at a shorter hit are not the longer hit's).  Returns how many
    pages were promoted."""
    ledger = lookup.ledger
    view = TierView(ledger, host.tables())
    cand = _record_hit(lookup, req, top, view)
    wanted, held = view.split()
    hosted_tables = host.tables()
    for pol in lookup.policies:
        dev, hosted = ledger.index_table(pol.gi), hosted_tables[pol.gi]
        wanted += [(pol.gi, hosted[k]) for k in pol.tier_rules.side_keys(req) if k not in dev and k in hosted]
    if not wanted:
        host.note_hit(req.request_id, 0)
        return 0
    own = DeviceHitView(ledger)
    device_only = _record_hit(lookup, req, top, own)
    for g, pages in own.split()[1].items():
        held[g] = list(dict.fromkeys(held.get(g, []) + pages))
    host.note_hit(req.request_id, cand - device_only)
    return host.promote(ledger, req.request_id, wanted, held, quota_of)
