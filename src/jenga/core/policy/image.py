"""Image kinds: cross-attention KV over encoder tokens, vision embeddings."""

from __future__ import annotations

from jenga.core.policy.base import NEVER, PageOps, Policy, cdiv
from jenga.core.prefix.index import image_key
from jenga.core.request import GroupState, ImageRef, ImageState, Request
from jenga.core.tables import ImageTable


class ImagePolicy(Policy):
    """Pages per image (cross-attention KV over encoder tokens): each image's pages are
    shared by every request showing it, whatever the text prefix; all pages of an image
    carry one prefix length, so images are evicted whole."""

    miss_reason = "evicted"

    per_image = True
    state_type = ImageState

    def longest_prefix(self, req: Request, cand: int, ops: PageOps) -> int:
        return cand  # independent of the text prefix

    def image_len(self, img: ImageRef) -> int:
        """One prefix length for every page of an image: the text position where the image
        ends, so images line up with the text around them and leave whole."""
        return img.offset + img.num_tokens

    def wanted(self, req: Request, gs: GroupState, end: int) -> list[int]:
        """Images that must be held for an allocation reaching ``end``."""
        if gs.initialized:
            return []
        return list(range(len(req.images)))

    def plan(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> int:
        need = 0
        for j in self.wanted(req, gs, end):
            img = req.images[j]
            n = cdiv(img.num_tokens, self.tpp)
            found = ([ops.find(self.gi, image_key(req.salt_root, img, i)) for i in range(n)]
                     if ops.caching else [None])
            if all(p is not None for p in found):
                for p in found:
                    ops.hold(self.gi, p)
                gs.pending[j] = found
            else:
                gs.pending[j] = None
                need += n
        return need

    def grow(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> None:
        for j, pages in gs.pending.items():
            if pages is None:
                pages = [ops.take(self.gi) for _ in range(cdiv(req.images[j].num_tokens, self.tpp))]
                gs.to_fill.add(j)
            gs.image_pages[j] = pages
        gs.pending.clear()
        gs.initialized = True
        if gs.table is None:
            gs.table = ImageTable(self.gi, self.tpp, gs.image_pages, gs.to_fill)

    def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        for j in list(gs.to_fill):
            img = req.images[j]
            if ops.caching:
                for i, page in enumerate(gs.image_pages[j]):
                    ops.register(self.gi, page, image_key(req.salt_root, img, i))
        gs.to_fill.clear()

    def free(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        for j, pages in gs.image_pages.items():
            for page in pages:
                ops.drop(self.gi, page, req.last_access, self.image_len(req.images[j]))
        gs.image_pages.clear()

    def limit(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        return NEVER if gs.initialized else 0

    def next_event(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        return 0 if gs.to_fill else NEVER

    def forget_plan(self, gs: GroupState) -> None:
        gs.pending.clear()


class VisionPolicy(ImagePolicy):
    """Vision embeddings of in-sequence image tokens: an image's pages are taken when
    prefill reaches it and released (cached by image) once all its tokens are consumed."""

    def wanted(self, req: Request, gs: GroupState, end: int) -> list[int]:
        start = req.start
        return [j for j, img in enumerate(req.images)
                if img.offset < end and img.offset + img.num_tokens > start and j not in gs.image_pages]

    def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        super().commit(req, gs, ops)
        for j in [j for j in gs.image_pages if sum(req.images[j][:2]) <= req.num_computed]:
            for page in gs.image_pages.pop(j):
                ops.drop(self.gi, page, ops.now, self.image_len(req.images[j]))

    def limit(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        start = req.start
        later = [img.offset for j, img in enumerate(req.images)
                 if j not in gs.image_pages and img.offset + img.num_tokens > start]
        return min(later) + 1 if later else NEVER

    def next_event(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        if gs.to_fill:
            return 0
        return min((sum(req.images[j][:2]) for j in gs.image_pages), default=NEVER)
