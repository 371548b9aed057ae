"""The owner of an instance's paged KV blocks: accounting, reservations, fences, KV events.

Every block of the instance is in exactly one place at a time, and :meth:`KVBlocks.check`
verifies the sum (``used + cached + free == capacity``, and every reference is held by someone):

* a **reservation** (decode side): blocks lent to a prefill instance to write a prompt's KV into,
  kept with the request's :class:`Prompt` (the prefill handed it over when it reserved);
* a **fence**: an aborted reservation whose writer has not confirmed it stopped writing — the
  blocks stay allocated (nobody else gets them) until the prefill acknowledges or the fence's
  quarantine ends (see docs/serve.md "Abort and fencing");
* a **kept table** (colocated): a prefilled request's blocks (and prompt) waiting for its decode;
* a table held by the prefill worker, the decode loop or a background pool put (counted in
  ``num_used``, owned by that caller until it frees them);
* the **cache** (named, unreferenced, LRU-evictable) or the **free** list.

Thread-safety and lock order: one internal lock, a *leaf* lock — no method calls out of this
object while holding it, so callers may hold their own lock (the decode loop's condition) when
calling in, and the order is always "caller's lock, then KV lock", never the reverse.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvcake.core.api import KVEvent, KVEventKind, SamplingParams
from kvcake.core.errors import EngineError
from kvcake.core.ids import BlockHash, InstanceId, RequestId
from kvcake.engine.block_manager import BlockManager, KVCacheFull
from kvcake.serve.events import EventLog

RESERVATION_TTL_S = 300.0  # a reservation nobody streams from is reclaimed after this
FENCE_QUARANTINE_S = 90.0  # > the prefill's KV write timeout (60 s): no write can land after it


@dataclass(frozen=True)
class Prompt:
    """What the decode side needs of a request besides its blocks, received once with them:
    the prompt (to decode from and to recompute after a preemption), its full blocks' hashes
    (the proxy's, continued by the decode loop, never recomputed) and the sampling."""

    tokens: tuple[int, ...]
    hashes: tuple[BlockHash, ...]
    sampling: SamplingParams


@dataclass
class Reserved:
    blocks: list[int]
    num_tokens: int
    prompt: Prompt
    created: float = field(default_factory=time.monotonic)


class KVBlocks:
    def __init__(self, blocks: BlockManager, block_tokens: int, instance_id: InstanceId):
        self._bm = blocks
        self.block_tokens = block_tokens
        self.capacity = blocks.capacity
        self._lock = threading.Lock()
        self._events = EventLog(instance_id, blocks)
        self._reserved: dict[RequestId, Reserved] = {}
        self._fenced: dict[RequestId, tuple[list[int], float]] = {}  # rid -> (blocks, until)
        self._kept: dict[RequestId, tuple[list[int], Prompt]] = {}

    # --- plain block accounting ---------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens)

    def allocate(self, n: int) -> list[int]:
        with self._lock:
            return self._bm.allocate(n)

    def free(self, blocks: Sequence[int]) -> None:
        if blocks:
            with self._lock:
                self._bm.free(blocks)

    def acquire(self, blocks: Sequence[int]) -> None:
        with self._lock:
            self._bm.acquire(blocks)

    def grow(self, table: list[int], num_tokens: int) -> bool:
        """Append blocks to ``table`` until it holds ``num_tokens``; False when KV is full."""
        with self._lock:
            need = self.blocks_for(num_tokens) - len(table)
            if need <= 0:
                return True
            try:
                table.extend(self._bm.allocate(need))
            except KVCacheFull:
                return False
            return True

    def lookup_prefix(self, hashes: Sequence[BlockHash], keep_tokens: int = 0) -> list[int]:
        """Referenced cached blocks of the longest prefix of ``hashes``; with ``keep_tokens``
        (the prompt length) at least one token is left to compute."""
        with self._lock:
            local = self._bm.lookup_prefix(hashes)
            if keep_tokens and local and len(local) * self.block_tokens >= keep_tokens:
                self._bm.free(local[-1:])
                local = local[:-1]
            return local

    def cached_prefix_len(self, hashes: Sequence[BlockHash]) -> int:
        with self._lock:
            return self._bm.cached_prefix_len(hashes)

    def register(self, blocks: Sequence[int], hashes: Sequence[BlockHash]) -> int:
        with self._lock:
            return self._bm.register(blocks, hashes)

    @property
    def num_used(self) -> int:
        with self._lock:
            return self._bm.num_used

    # --- reservations and fences (decode side) ------------------------------------------------
    def reserve(self, rid: RequestId, num_tokens: int, prompt: Prompt) -> list[int]:
        """Blocks for ``num_tokens`` tokens lent to ``rid``'s prefill (raises ``KVCacheFull``)."""
        with self._lock:
            self._expire()
            if rid in self._reserved or rid in self._fenced:
                raise EngineError(f"request {rid} already has a reservation")
            blocks = self._bm.allocate(self.blocks_for(num_tokens))
            self._reserved[rid] = Reserved(blocks, num_tokens, prompt)
            return blocks

    def take(self, rid: RequestId) -> tuple[list[int], Prompt] | None:
        """The request's table and prompt for decoding: its reservation, or its colocated
        kept table."""
        with self._lock:
            res = self._reserved.pop(rid, None)
            return (res.blocks, res.prompt) if res is not None else self._kept.pop(rid, None)

    def owns(self, rid: RequestId) -> bool:
        with self._lock:
            return rid in self._reserved or rid in self._kept

    def keep(self, rid: RequestId, table: list[int], prompt: Prompt) -> None:
        with self._lock:
            self._kept[rid] = (table, prompt)

    def release(self, rid: RequestId, writer_stopped: bool) -> None:
        """Abort: free the request's blocks — a reservation at once only when its writer has
        confirmed it stopped, else fenced for :data:`FENCE_QUARANTINE_S`."""
        with self._lock:
            res = self._reserved.pop(rid, None)
            if res is not None:
                if writer_stopped:
                    self._bm.free(res.blocks)
                else:
                    self._fenced[rid] = (res.blocks, time.monotonic() + FENCE_QUARANTINE_S)
            elif writer_stopped and rid in self._fenced:
                self._bm.free(self._fenced.pop(rid)[0])  # the late acknowledgement
            kept = self._kept.pop(rid, None)
            if kept is not None:
                self._bm.free(kept[0])

    def expire(self) -> None:
        with self._lock:
            self._expire()

    def _expire(self) -> None:
        now = time.monotonic()
        for rid in [r for r, v in self._reserved.items() if now - v.created > RESERVATION_TTL_S]:
            # The proxy never came back for it; its prefill is long over (the proxy reserves
            # right before the prefill runs, and a prefill's writes time out after 60 s).
            self._bm.free(self._reserved.pop(rid).blocks)
        for rid in [r for r, (_, until) in self._fenced.items() if now >= until]:
            self._bm.free(self._fenced.pop(rid)[0])

    # --- KV events ----------------------------------------------------------------------------
    def events_since(self, seq: int) -> list[KVEvent]:
        with self._lock:
            return self._events.since(seq)

    def event_bounds(self) -> tuple[int, int]:
        with self._lock:
            return self._events.bounds()

    def pool_event(self, kind: KVEventKind, hashes: Iterable[BlockHash]) -> None:
        with self._lock:
            self._events.pool(kind, hashes)

    # --- checks -------------------------------------------------------------------------------
    def check(self) -> dict[str, int]:
        """Assert the accounting invariants; returns the counts (``GET /rpc/kv``)."""
        with self._lock:
            self._bm.check()
            reserved = sum(len(r.blocks) for r in self._reserved.values())
            fenced = sum(len(b) for b, _ in self._fenced.values())
            kept = sum(len(b) for b, _ in self._kept.values())
            used = self._bm.num_used
            assert reserved + fenced + kept <= used, (reserved, fenced, kept, used)
            return {
                "capacity": self.capacity, "used": used, "cached": self._bm.num_cached,
                "free": self._bm.num_free - self._bm.num_cached, "reserved": reserved,
                "fenced": fenced, "kept": kept, "reservations": len(self._reserved),
            }  # fmt: skip
