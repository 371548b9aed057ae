"""Shared interface types: what the proxy asks of an instance, what instances report back, and
the cluster snapshot the conductor decides on.

These are plain dataclasses and ABCs with no I/O, so the live proxy, the instances and the
simulator exchange exactly the same shapes. Wire forms are derived from them by ``serve``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from kvcake.core.ids import BlockHash, InstanceId, RequestId, SegmentName


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"  # colocated: one instance prefills and decodes (the vLLM-like baseline)


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # Salts the block-hash chain (core.hashing.salted_root): the proxy sets it from the
    # request's tenant and/or ``cache_salt``; the prefill and decode instances name (and pool)
    # the request's blocks with it, so different salts never share KV.
    cache_salt: str = ""
    # The tenant charged for the request's pooled blocks (the store master's tenant quotas).
    tenant: str = ""

    def __post_init__(self) -> None:
        if len(self.cache_salt) > 512:
            raise ValueError("cache_salt must be at most 512 characters")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


# --- instance API -----------------------------------------------------------------------------


@dataclass(frozen=True)
class KVReservation:
    """KV blocks a decode instance reserved for one request.

    Invariant: the blocks stay reserved (not reused, not evicted) until the request finishes or
    is aborted on the decode instance; the prefill instance may write into them meanwhile, and
    nobody else may. ``block_ids`` index the decode instance's paged KV memory, which is
    registered with the Transfer Engine as ``segment``; ``layout`` names the byte layout so the
    writer can compute offsets (``block_bytes`` per block, ``layer_bytes`` per block per layer).
    """

    request_id: RequestId
    instance_id: InstanceId
    segment: SegmentName
    block_ids: tuple[int, ...]
    block_tokens: int
    block_bytes: int
    layer_bytes: int
    layout: str = "block-layer-kv"


@dataclass(frozen=True)
class BlockSource:
    """Where a prefill instance should fetch prefix blocks it does not hold: the pool
    (``holder=None``) or another instance's KV memory."""

    first_block: int  # index into the request's block list
    num_blocks: int
    holder: InstanceId | None = None


@dataclass(frozen=True)
class DecodeTarget:
    """The decode instance a prefill writes its KV into. The prefill instance asks it for the
    reservation itself (``InstanceAPI.reserve_kv`` at ``url``), handing it the prompt on the
    way, so neither the reservation nor the prompt goes back through the proxy."""

    instance_id: InstanceId
    url: str  # the decode instance's RPC address
    num_tokens: int  # tokens to reserve KV for: the prompt plus a margin
    wait_s: float = 30.0  # how long a full decode KV memory is waited for (then ``kv_full``)


@dataclass(frozen=True)
class PrefillTask:
    """One prefill, the only message that carries the prompt from the proxy. ``block_hashes``
    are the proxy's (computed once; the prefill checks them cheaply). ``decode`` is ``None``
    when the same instance will decode (colocated)."""

    request_id: RequestId
    prompt_tokens: tuple[int, ...]
    block_hashes: tuple[BlockHash, ...]
    sampling: SamplingParams
    fetch: tuple[BlockSource, ...] = ()
    decode: DecodeTarget | None = None


@dataclass(frozen=True)
class PrefillResult:
    request_id: RequestId
    first_token: int
    prompt_tokens: int
    cached_tokens: int  # tokens whose KV was reused (local, fetched or from the pool)
    computed_tokens: int
    timings: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    # Where the reused blocks came from, as the prefill instance saw it (serve.attribution):
    # blocks per source — "local", "memory:<segment>" / "disk:<segment>" (pool reads), and
    # "fetch:not_found" / "fetch:failed" / "fetch:too_slow" (pool reads that did not succeed).
    kv_sources: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TokenChunk:
    """One streamed piece of output. ``finish_reason`` is set on the last chunk only."""

    request_id: RequestId
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    error: str | None = None


@dataclass(frozen=True)
class LoadReport:
    """An instance's load, sent periodically to the proxy (and built by the simulator)."""

    instance_id: InstanceId
    role: Role
    timestamp: float
    queued_requests: int = 0
    queued_prefill_tokens: int = 0
    queued_prefill_seconds: float = 0.0  # predicted time to finish the queue
    running_requests: int = 0
    running_context_tokens: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    recent_ttft_s: float = 0.0
    recent_tbt_s: float = 0.0
    healthy: bool = True
    preemptions: int = 0  # decode preemptions since the instance started (a running total)

    def __post_init__(self) -> None:
        if not 0 <= self.kv_blocks_used <= max(self.kv_blocks_total, self.kv_blocks_used):
            raise ValueError("kv_blocks_used must be non-negative")
        if self.kv_blocks_total and self.kv_blocks_used > self.kv_blocks_total:
            raise ValueError("kv_blocks_used exceeds kv_blocks_total")


class KVEventKind(StrEnum):
    STORED = "stored"
    REMOVED = "removed"


@dataclass(frozen=True)
class KVEvent:
    """Blocks that became available in (or left) a holder's cache. ``seq`` increases by one per
    event per instance, so a consumer detects a gap and asks for a full resync."""

    seq: int
    instance_id: InstanceId
    kind: KVEventKind
    block_hashes: tuple[BlockHash, ...]


# --- store (pool) events ------------------------------------------------------------------------
# Published by the store master (zmq PUB, docs/store.md "KV events"); consumed by the proxy's pool
# index (serve.pool_events), the vLLM integration and observability. Stable: add fields only at
# the end with defaults, never rename or reuse a kind.

STORE_EVENTS_TOPIC = b"kvcake.store.kv"  # first frame of every message; the second is the batch


class StoreEventKind(StrEnum):
    """What happened to ``keys`` in the pool. A consumer tracks, per key, the set of tiers
    (``"memory"``, ``"disk"``) holding a readable copy; a key is in the pool while that set is
    not empty."""

    # keys now have a readable copy in ``tier`` (put ended, offload/promotion done, disk adopted)
    STORED = "stored"
    EVICTED_MEMORY = "evicted_memory"  # the memory copies of keys were evicted (tier "memory")
    EVICTED_DISK = "evicted_disk"  # the disk copies of keys were dropped (tier "disk")
    REMOVED = "removed"  # keys left the pool from every tier (remove, remove_all, overwrite)
    # ``segment`` left the pool (node died or unmounted); keys lost their last copy in ``tier``
    SEGMENT_LOST = "segment_lost"


@dataclass(frozen=True)
class StoreEvent:
    """One change of the pool. ``seq`` increases by one per event of a ``publisher`` (one
    master run); a consumer that sees a gap, or a new publisher, resynchronises from a
    :class:`StoreSnapshot`."""

    seq: int
    publisher: str
    kind: StoreEventKind
    keys: tuple[str, ...]
    tier: str = ""  # "memory" | "disk"; "" for REMOVED
    segment: str = ""  # SEGMENT_LOST: the segment that left
    timestamp: float = 0.0  # master wall clock (time.time()) when the change was applied


@dataclass(frozen=True)
class StoreSnapshot:
    """The pool's readable contents as of event ``seq`` of ``publisher``: key -> tiers."""

    publisher: str
    seq: int
    keys: dict[str, tuple[str, ...]] = field(default_factory=dict)


class PoolView:
    """Pure consumer-side state of the store events: key -> tiers, with gap detection.

    ``apply`` returns the keys that entered and left the pool with that event; it returns
    ``None`` (and sets ``in_sync = False``) on a gap or a new publisher, after which the caller
    must ``load`` a snapshot. Events older than the loaded snapshot are ignored."""

    def __init__(self) -> None:
        self.tiers: dict[str, set[str]] = {}
        self.publisher = ""
        self.seq = -1
        self.in_sync = False

    def load(self, snap: StoreSnapshot) -> tuple[list[str], list[str]]:
        """Replace the contents; returns (entered, left) relative to the previous contents."""
        old = set(self.tiers)
        self.tiers = {k: set(t) for k, t in snap.keys.items() if t}
        self.publisher, self.seq, self.in_sync = snap.publisher, snap.seq, True
        return [k for k in self.tiers if k not in old], [k for k in old if k not in self.tiers]

    def apply(self, ev: StoreEvent) -> tuple[list[str], list[str]] | None:
        if not self.in_sync or ev.publisher != self.publisher:
            self.in_sync = False
            return None
        if ev.seq <= self.seq:
            return [], []  # already reflected by the snapshot
        if ev.seq != self.seq + 1:
            self.in_sync = False
            return None
        self.seq = ev.seq
        entered: list[str] = []
        left: list[str] = []
        for key in ev.keys:
            before = bool(self.tiers.get(key))
            if ev.kind is StoreEventKind.STORED:
                self.tiers.setdefault(key, set()).add(ev.tier)
            elif ev.kind is StoreEventKind.REMOVED:
                self.tiers.pop(key, None)
            else:  # evicted / segment lost: that tier's copy is gone
                t = self.tiers.get(key)
                if t is not None:
                    t.discard(ev.tier or "memory")
                    if not t:
                        del self.tiers[key]
            after = bool(self.tiers.get(key))
            if after and not before:
                entered.append(key)
            elif before and not after:
                left.append(key)
        return entered, left


class InstanceAPI(ABC):
    """What the proxy asks of a prefill or decode instance (live) — the simulator models the
    same operations. Implementations own their KV memory; callers never free it directly."""

    instance_id: InstanceId
    role: Role

    @abstractmethod
    async def reserve_kv(
        self,
        request_id: RequestId,
        num_tokens: int,
        prompt_tokens: tuple[int, ...],
        block_hashes: tuple[BlockHash, ...],
        sampling: SamplingParams,
    ) -> KVReservation:
        """Decode side, asked by the request's prefill instance: reserve blocks for
        ``num_tokens`` of prompt KV (raises if full) and keep the prompt, its block hashes and
        sampling for the decode (``stream_tokens`` then needs only the first token)."""

    @abstractmethod
    async def submit_prefill(self, task: PrefillTask) -> PrefillResult:
        """Prefill side: reserve KV on ``task.decode``, fetch the named prefix, compute the
        rest, write KV into the reservation (layer by layer) and return the first token."""

    @abstractmethod
    def stream_tokens(self, request_id: RequestId, first_token: int) -> AsyncIterator[TokenChunk]:
        """Decode side: join the batch once the reserved KV is complete; yield tokens."""

    @abstractmethod
    async def abort(self, request_id: RequestId, writer_stopped: bool = False) -> bool:
        """Stop a request wherever it is and free its KV; unknown ids are ignored. Returns once
        this instance writes nothing more for the request (True) or cannot tell (False).
        ``writer_stopped``: the request's prefill confirmed it stopped writing into this
        instance's reserved blocks (else they stay fenced for a quarantine period)."""

    @abstractmethod
    async def drain(self) -> None:
        """Stop accepting work, finish what is running."""

    @abstractmethod
    def load_report(self) -> LoadReport: ...

    @abstractmethod
    def kv_events(self, since_seq: int) -> list[KVEvent]:
        """Events with ``seq > since_seq`` still buffered (oldest first)."""


# --- conductor snapshot -----------------------------------------------------------------------


class KVIndex:
    """Which holder (instance or store segment) has which block. Mutable; kept current by KV
    events. ``prefix_matches`` costs O(matched blocks), not O(index size)."""

    def __init__(self) -> None:
        self._holders: dict[BlockHash, set[InstanceId]] = {}
        self._count: dict[InstanceId, int] = {}

    def add(self, holder: InstanceId, blocks: Iterable[BlockHash]) -> None:
        for b in blocks:
            s = self._holders.setdefault(b, set())
            if holder not in s:
                s.add(holder)
                self._count[holder] = self._count.get(holder, 0) + 1

    def remove(self, holder: InstanceId, blocks: Iterable[BlockHash]) -> None:
        for b in blocks:
            s = self._holders.get(b)
            if s and holder in s:
                s.discard(holder)
                self._count[holder] -= 1
                if not s:
                    del self._holders[b]

    def drop_holder(self, holder: InstanceId) -> None:
        for b in [b for b, s in self._holders.items() if holder in s]:
            self.remove(holder, (b,))
        self._count.pop(holder, None)

    def apply(self, event: KVEvent) -> None:
        if event.kind is KVEventKind.STORED:
            self.add(event.instance_id, event.block_hashes)
        else:
            self.remove(event.instance_id, event.block_hashes)

    def holders(self, block: BlockHash) -> frozenset[InstanceId]:
        return frozenset(self._holders.get(block, ()))

    def blocks_of(self, holder: InstanceId) -> int:
        return self._count.get(holder, 0)

    def prefix_matches(self, blocks: Sequence[BlockHash]) -> dict[InstanceId, int]:
        """For every holder of ``blocks[0]``: how many leading blocks it holds."""
        if not blocks:
            return {}
        active = set(self._holders.get(blocks[0], ()))
        out: dict[InstanceId, int] = {}
        for i in range(1, len(blocks)):
            if not active:
                break
            here = self._holders.get(blocks[i], set())
            for h in active - here:
                out[h] = i
            active &= here
        for h in active:
            out[h] = len(blocks)
        return out

    def __len__(self) -> int:
        return len(self._holders)


@dataclass(frozen=True)
class RequestView:
    """What the conductor knows of a request at arrival."""

    request_id: RequestId
    arrival_s: float
    prompt_len: int
    block_hashes: tuple[BlockHash, ...]
    expected_output: int = 256


@dataclass(frozen=True)
class PrefillState:
    instance_id: InstanceId
    queued_seconds: float  # predicted time until the queue ahead of a new request is done
    queued_requests: int = 0
    fetch_bandwidth: float = 0.0  # bytes/s this instance can pull from others (0 = cluster default)
    healthy: bool = True


@dataclass(frozen=True)
class DecodeState:
    instance_id: InstanceId
    running_requests: int
    running_context_tokens: int
    kv_capacity_tokens: int
    pending_requests: int = 0  # accepted, still in prefill: will join the batch soon
    pending_context_tokens: int = 0
    healthy: bool = True


@dataclass(frozen=True)
class ClusterSnapshot:
    """The conductor's view at one instant. ``kv_index`` is shared, not copied: a policy reads
    it and must not mutate it."""

    now_s: float
    prefill: tuple[PrefillState, ...]
    decode: tuple[DecodeState, ...]
    kv_index: KVIndex
    block_tokens: int
    kv_bytes_per_token: int
    link_bandwidth: float  # default bytes/s between instances / from the pool


@dataclass(frozen=True)
class Accept:
    prefill: InstanceId
    decode: InstanceId
    local_prefix_blocks: int  # blocks the prefill instance already holds
    fetch: tuple[BlockSource, ...]  # blocks to pull before computing
    expected_ttft_s: float
    expected_tbt_s: float


@dataclass(frozen=True)
class Reject:
    reason: str
    expected_ttft_s: float = 0.0
    expected_tbt_s: float = 0.0


Decision = Accept | Reject


def segment_of(instance_id: InstanceId) -> SegmentName:
    """The Transfer Engine segment name under which an instance registers its KV memory."""
    return SegmentName(f"kv/{instance_id}")
