"""Block copies that carry a Mamba state in and out of a block-table column mid-block.

vLLM's align-mode worker keeps a request's running state in the block-table column
``cdiv(step end, B) - 1`` (``B``: the Mamba block) and writes each step's end state there.
When jenga's token pages are finer than ``B`` (vLLM hashes prompts every
``prefix_match_unit`` tokens, :func:`jenga.vllm.plan.sub_block_page`), a state checkpoint or a
prefix hit can sit inside a column:

* *fill*: a step ends on checkpoint ``t`` with ``t % B != 0``.  The worker writes the state
  after ``t`` tokens into the page at the column, which the next step continues in place.
  The page is copied into the checkpoint's own page before anything else runs, i.e. at the
  start of the *next* scheduled step (``fill`` now, emitted by the next ``step``);
* *read*: a request resumes a checkpoint ``h`` with ``h % B != 0``.  Its step reads its
  initial state from the column ``h // B``: the checkpoint is copied into the page there at
  the start of this step (``read``).

vLLM runs a step's copies (``SchedulerOutput.kv_cache_block_copies``,
``copy_kv_cache_blocks_inplace``) before its forward, as one gather of every source and one
scatter into every destination.  So a read of a checkpoint whose fill runs in the same batch
copies from the fill's source instead (the same bytes, not written yet by any forward), and a
page that receives two copies in one batch (let go of and taken again within the step) keeps
the later one.  The ids are vLLM block (exec) ids; copying exec id ``e`` in every layer view
copies exactly one page of the largest page size (``jenga.vllm.plan.copy_safe``)."""

from __future__ import annotations

from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy


class StateCopies:
    """The copies of the step being scheduled and the fills waiting for the next one."""

    def __init__(self) -> None:
        self._next: list[tuple[str, int, int, int]] = []  # fills of steps scheduled now: (request, t, src, dst)
        self._batch: dict[int, int] = {}  # dst -> src, in order: the copies of the step being scheduled
        self._filled: dict[int, int] = {}  # dst -> src of the fills in the batch
        self.num_copies = 0  # copies handed to vLLM so far

    def step(self) -> None:
        """A schedule starts: the fills of the steps scheduled before run with this one."""
        for _, _, src, dst in self._next:
            self._put(src, dst)
            self._filled[dst] = src
        self._next = []

    def fill(self, request_id: str, pos: int, src: int, dst: int) -> None:
        """The step scheduled now ends on checkpoint ``pos``, written by the worker into ``src``:
        copy it into ``dst`` before the next step."""
        self._next.append((request_id, pos, src, dst))

    def read(self, src: int, dst: int) -> None:
        """The step scheduled now resumes the checkpoint in ``src`` from the page ``dst``."""
        if any(d == src for _, _, _, d in self._next):
            raise AssertionError(f"jenga.vllm: a prefix hit reads state block {src} before the step that writes "
                                 "it has run")
        self._put(self._filled.get(src, src), dst)

    def cancel(self, request_id: str, computed: int) -> None:
        """``request_id`` is freed with ``computed`` tokens computed: the fills of its steps past
        them are void (jenga lets their checkpoint pages go uncached)."""
        self._next = [f for f in self._next if f[0] != request_id or f[1] <= computed]

    def _put(self, src: int, dst: int) -> None:
        self._batch.pop(dst, None)
        self._batch[dst] = src

    def take(self) -> list[KVCacheBlockCopy]:
        """The copies of the step just scheduled (``take_kv_cache_block_copies``)."""
        if not self._batch:  # no copy this step (``_filled`` only names copies in the batch)
            return []
        out = [KVCacheBlockCopy(src_block_id=s, dst_block_id=d) for d, s in self._batch.items()]
        self._batch, self._filled = {}, {}
        self.num_copies += len(out)
        return out

    @property
    def pending(self) -> int:
        """Fills not emitted yet (tests; a finished workload emits them with its last steps)."""
        return len(self._next)
