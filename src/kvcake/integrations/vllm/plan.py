"""Scheduler-side bookkeeping of the connector: which blocks to load and which to save.

Pure logic over token ids and block ids (no vLLM, no sockets), so it is unit-tested alone.
The scheduler connector calls :meth:`Planner.match` from ``get_num_new_matched_tokens``,
:meth:`Planner.allocated` from ``update_state_after_alloc`` and :meth:`Planner.step` from
``build_connector_meta``; the resulting :class:`StepPlan` travels to the worker.

Invariants: a load covers only whole blocks in ``[local hit, pooled prefix)`` and never the
prompt's last token (vLLM must compute at least one); a block counts as pooled only when every
tensor-parallel rank's object of it exists; a block is planned for saving at most once per
request, and only in the step after which its KV is complete (a worker whose load for a
request failed saves none of that request's blocks: they may have been computed on top of the
failed ones). After a failed load, every later lookup for that request is a miss (vLLM issue 55297: a
connector that finds the same blocks again loads them again, forever).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvcake.integrations.vllm.keys import BlockNamer, lineage
from kvcake.store.protocol import BlockMeta

Exists = Callable[[list[str]], list[bool]]


@dataclass
class BlockRun:
    """Store keys and the vLLM block ids they map to (same length)."""

    req_id: str
    keys: list[str]
    block_ids: list[int]
    # saves: the blocks' parents and token ids (keys.lineage), for routers' KV events
    lineage: list[BlockMeta] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.block_ids):
            raise ValueError(f"{len(self.keys)} keys for {len(self.block_ids)} blocks")


@dataclass
class StepPlan:
    """What the worker does in one engine step: load before the forward, save after it."""

    loads: list[BlockRun] = field(default_factory=list)
    saves: list[BlockRun] = field(default_factory=list)


@dataclass
class _Track:
    keys: list[str]
    pooled: int  # leading blocks found in the pool at lookup
    local: int  # leading blocks vLLM had cached locally (block aligned)
    block_ids: list[int] = field(default_factory=list)
    saved: int = 0  # blocks [0, saved) are in the pool or queued to be
    tokens: Sequence[int] = ()  # the prompt: the saved blocks' token ids


class Planner:
    """Per-engine scheduler state. Bounded by the number of live requests (``finished`` drops
    a request's entry)."""

    def __init__(self, namer: BlockNamer, save: bool = True):
        self.namer = namer
        self.block_tokens = namer.block_tokens
        self.save = save
        self._tracks: dict[str, _Track] = {}
        self._loads: dict[str, BlockRun] = {}  # planned, not yet sent to the workers
        self._sent: dict[str, list[int]] = {}  # the block ids of each request's sent load
        self._failed: set[str] = set()  # requests whose load failed: no pool lookup any more

    def match(
        self,
        req_id: str,
        prompt: Sequence[int],
        local_tokens: int,
        exists: Exists | None,
        save: bool = True,
    ) -> int:
        """Tokens beyond ``local_tokens`` that can be loaded from the pool (block multiple).

        ``exists`` is None when the pool is unavailable: nothing is loaded, nothing saved.
        ``save=False``: this request's blocks are not saved (a P/D prefill sending directly)."""
        self._sent.pop(req_id, None)  # a new lookup: the old load's block ids are not its own
        if exists is None:
            self._tracks.pop(req_id, None)
            return 0
        keys = self.namer.keys(prompt)
        pooled = self._pooled(keys, exists) if req_id not in self._failed else 0
        local = local_tokens // self.block_tokens
        saved = pooled if save else len(keys)
        self._tracks[req_id] = _Track(keys, pooled, local, saved=saved, tokens=prompt)
        limit = (len(prompt) - 1) // self.block_tokens  # leave >= 1 token to compute
        hit = min(pooled, limit)
        return max(0, hit - local) * self.block_tokens

    def allocated(self, req_id: str, block_ids: Sequence[int], external_tokens: int) -> None:
        """vLLM allocated ``block_ids`` (all of the request's) and will load ``external_tokens``."""
        track = self._tracks.get(req_id)
        if track is None or external_tokens <= 0:
            return
        n = external_tokens // self.block_tokens
        first = track.local
        ids = list(block_ids[first : first + n])
        if len(ids) != n:
            raise ValueError(f"{req_id}: {n} blocks to load but only {len(ids)} allocated")
        self._loads[req_id] = BlockRun(req_id, track.keys[first : first + n], ids)

    def step(self, scheduled: Sequence[tuple[str, Sequence[int] | None, bool, int]]) -> StepPlan:
        """One engine step. ``scheduled``: (req_id, new block ids or None, block ids replace the
        old ones (new or resumed request), tokens computed once this step ran)."""
        plan = StepPlan(loads=list(self._loads.values()))
        self._sent.update((r, run.block_ids) for r, run in self._loads.items())
        self._loads.clear()
        for req_id, new_ids, replace, done_tokens in scheduled:
            track = self._tracks.get(req_id)
            if track is None:
                continue
            if replace:
                track.block_ids = list(new_ids or [])
            elif new_ids:
                track.block_ids.extend(new_ids)
            ready = min(len(track.keys), done_tokens // self.block_tokens, len(track.block_ids))
            if self.save and ready > track.saved:
                plan.saves.append(
                    BlockRun(
                        req_id,
                        track.keys[track.saved : ready],
                        track.block_ids[track.saved : ready],
                        lineage(track.keys, track.tokens, track.saved, ready, self.block_tokens),
                    )
                )
                track.saved = ready
        return plan

    def _pooled(self, keys: list[str], exists: Exists) -> int:
        """Leading blocks of ``keys`` whose every rank's object is in the pool."""
        if not keys:
            return 0
        n = self.namer.tp_size
        found = exists([o for k in keys for o in self.namer.all_ranks(k)])
        pooled = 0
        while pooled < len(keys) and all(found[pooled * n : (pooled + 1) * n]):
            pooled += 1
        return pooled

    def load_failed(self, block_ids: set[int]) -> list[str]:
        """vLLM reported ``block_ids`` as failed loads: the requests whose sent load they were
        part of never look the pool up again. Returns those requests."""
        hit = [r for r, ids in self._sent.items() if not block_ids.isdisjoint(ids)]
        self._failed.update(hit)
        for req_id in hit:
            del self._sent[req_id]
        return hit

    def finished(self, req_id: str) -> None:
        self._tracks.pop(req_id, None)
        self._loads.pop(req_id, None)
        self._sent.pop(req_id, None)
        self._failed.discard(req_id)

    def __len__(self) -> int:
        return len(self._tracks)
