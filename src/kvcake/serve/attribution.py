"""Where every prompt token's KV came from, and why the computed ones were computed.

The prefill instance reports what it *did* (``PrefillResult.kv_sources``, blocks per source:
its own cache, each pool replica it read — segment and tier — and the blocks it tried to read
but could not, by failure kind). The proxy adds what only it knows: which blocks another
holder had when the request was placed (``held_elsewhere``) and which blocks were evicted
lately (:class:`EvictionMemory`, fed by the instances' ``REMOVED`` KV events and the store
master's eviction events). :func:`attribute` combines both into one :class:`Attribution`.

Every prompt token lands in exactly one bucket:
``local + sum(pool_dram) + sum(ssd) + computed == prompt_tokens`` and
``sum(miss_reasons) == computed`` (checked in ``__post_init__``).

Miss reasons (tokens):

* ``never_seen``: no cache anywhere had the block and it was not evicted lately.
* ``evicted``: the block was evicted lately (from an instance's cache or from the pool).
* ``routed_elsewhere``: another instance or the pool held it when the request was placed, but
  the conductor chose not to fetch it (policy: e.g. the prefix was too short to be worth it).
* ``fetch_failed``: the prefill instance tried to read it from the pool and the read failed
  (node down, transfer error, or the object was gone without an eviction we heard of).
* ``too_slow``: the read was started but outlived its lease / the fetch deadline.
* ``last_block``: the block holding the prompt's last token — always computed, because the
  model must run that token to produce the first output token (and a partial block is never
  cached).
* ``unknown``: the instance did not report its sources (an older instance or engine).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvcake.conductor.index import PrefixIndex
from kvcake.core.ids import BlockHash

# Keys of PrefillResult.kv_sources (blocks). Pool reads are "memory:<segment>" / "disk:<segment>".
LOCAL = "local"
FETCH_NOT_FOUND = "fetch:not_found"
FETCH_FAILED = "fetch:failed"
FETCH_TOO_SLOW = "fetch:too_slow"
FETCH_KINDS = (FETCH_NOT_FOUND, FETCH_FAILED, FETCH_TOO_SLOW)

NEVER_SEEN, EVICTED, ROUTED_ELSEWHERE = "never_seen", "evicted", "routed_elsewhere"
FETCH_FAILED_R, TOO_SLOW, LAST_BLOCK, UNKNOWN = "fetch_failed", "too_slow", "last_block", "unknown"
REASONS = (NEVER_SEEN, EVICTED, ROUTED_ELSEWHERE, FETCH_FAILED_R, TOO_SLOW, LAST_BLOCK, UNKNOWN)
TIERS = ("local", "pool_dram", "ssd", "computed")


def pool_source(tier: str, segment: str) -> str:
    """The ``kv_sources`` key of blocks read from ``segment`` in ``tier`` (memory / disk). A
    storage node's disk segment is ``<node>.ssd`` (store.server): it is named by its node."""
    if tier == "disk":
        return f"disk:{segment.removesuffix('.ssd')}"
    return f"memory:{segment}"


class EvictionMemory:
    """Block hashes evicted lately, bounded (the oldest are forgotten first). Thread-safe:
    the pool subscriber and the instance poller add, request handlers read."""

    def __init__(self, max_blocks: int = 65536):
        if max_blocks < 1:
            raise ValueError("max_blocks must be >= 1")
        self.max_blocks = max_blocks
        self._set: OrderedDict[BlockHash, None] = OrderedDict()
        self._mu = threading.Lock()
        self.added = 0

    def add(self, hashes: Iterable[BlockHash]) -> None:
        with self._mu:
            for h in hashes:
                self._set[h] = None
                self._set.move_to_end(h)
                self.added += 1
            while len(self._set) > self.max_blocks:
                self._set.popitem(last=False)

    def discard(self, hashes: Iterable[BlockHash]) -> None:
        """Blocks stored again are no longer "evicted" (a later miss has another cause)."""
        with self._mu:
            for h in hashes:
                self._set.pop(h, None)

    def __contains__(self, h: object) -> bool:
        return h in self._set

    def __len__(self) -> int:
        return len(self._set)


@dataclass(frozen=True)
class Attribution:
    prompt_tokens: int
    local_tokens: int = 0
    pool_dram_tokens: dict[str, int] = field(default_factory=dict)  # storage node -> tokens
    ssd_tokens: dict[str, int] = field(default_factory=dict)  # storage node -> tokens
    computed_tokens: int = 0
    miss_reasons: dict[str, int] = field(default_factory=dict)  # reason -> tokens

    def __post_init__(self) -> None:
        served = self.local_tokens + sum(self.pool_dram_tokens.values())
        served += sum(self.ssd_tokens.values())
        if served + self.computed_tokens != self.prompt_tokens:
            raise ValueError(f"attribution does not add up: {self}")
        if sum(self.miss_reasons.values()) != self.computed_tokens:
            raise ValueError(f"miss reasons do not add up to the computed tokens: {self}")

    @property
    def cached_tokens(self) -> int:
        return self.prompt_tokens - self.computed_tokens

    def as_dict(self) -> dict[str, Any]:
        """The ``usage.kvcake`` object of a response and the ``kv`` field of a log line."""
        return {
            "local_tokens": self.local_tokens,
            "pool_dram_tokens": dict(self.pool_dram_tokens),
            "ssd_tokens": sum(self.ssd_tokens.values()),
            "ssd_tokens_by_node": dict(self.ssd_tokens),
            "computed_tokens": self.computed_tokens,
            "miss_reasons": {r: n for r, n in self.miss_reasons.items() if n},
        }


def _block_tokens(i: int, bt: int, n: int) -> int:
    return max(0, min((i + 1) * bt, n) - i * bt)


@dataclass(frozen=True)
class Placement:
    """What the proxy's index said when the request was placed."""

    elsewhere: int = 0  # longest prefix (blocks) a holder other than the chosen instance had
    present: tuple[bool, ...] = ()  # per block: some holder had it (prefix or not)


def placement(index: Any, hashes: Sequence[BlockHash], me: Any, limit: int) -> Placement:
    """Read ``index`` (a ``KVIndex``) for the first ``limit`` blocks of a request placed on
    ``me``."""
    if limit <= 0:
        return Placement()
    head = list(hashes[:limit])
    matches = index.prefix_matches(head)
    other = max((n for h, n in matches.items() if h != me), default=0)
    return Placement(other, tuple(bool(index.holders(h)) for h in head))


def attribute(
    prompt_tokens: int,
    block_tokens: int,
    hashes: Sequence[BlockHash],
    kv_sources: Mapping[str, int],
    placed: Placement,
    evicted: Callable[[BlockHash], bool],
) -> Attribution:
    """Combine the instance's report with the proxy's knowledge (see the module doc).

    ``hashes`` are the prompt's full-block hashes; ``evicted(h)``: ``h`` left some cache
    lately. A computed block is ``routed_elsewhere`` if another holder had the prefix up to
    it; a block some cache still held behind a broken prefix inherits the reason of the
    block that broke it (reusing it was impossible)."""
    n, bt = prompt_tokens, block_tokens
    if not kv_sources:  # nothing reported: only the total is known
        return Attribution(n, computed_tokens=n, miss_reasons={UNKNOWN: n})
    limit = min((n - 1) // bt, len(hashes))  # blocks that could ever be reused
    local = min(int(kv_sources.get(LOCAL, 0)), limit)
    pool: dict[str, int] = {}
    ssd: dict[str, int] = {}
    i = local
    for key in sorted(kv_sources):  # pool reads follow the local prefix, in any order
        tier, _, seg = key.partition(":")
        if tier not in ("memory", "disk") or not seg:
            continue
        k = min(int(kv_sources[key]), limit - i)
        toks = k * bt
        (ssd if tier == "disk" else pool)[seg] = (ssd if tier == "disk" else pool).get(
            seg, 0
        ) + toks
        i += k
    reasons = dict.fromkeys(REASONS, 0)
    for kind in FETCH_KINDS:  # blocks right after the read ones: tried, not read
        k = min(int(kv_sources.get(kind, 0)), limit - i)
        for b in range(i, i + k):
            if kind == FETCH_TOO_SLOW:
                r = TOO_SLOW
            elif kind == FETCH_NOT_FOUND and evicted(hashes[b]):
                r = EVICTED
            else:
                r = FETCH_FAILED_R
            reasons[r] += bt
        i += k
    carry = ""
    for b in range(i, limit):
        if b < placed.elsewhere:
            r = ROUTED_ELSEWHERE
        elif evicted(hashes[b]):
            r = EVICTED
        elif carry and b < len(placed.present) and placed.present[b]:
            r = carry
        else:
            r = NEVER_SEEN
        carry = r
        reasons[r] += bt
    reasons[LAST_BLOCK] += n - limit * bt
    computed = n - local * bt - sum(pool.values()) - sum(ssd.values())
    return Attribution(n, local * bt, pool, ssd, computed, {r: v for r, v in reasons.items() if v})


def fallback(prompt_tokens: int, cached_tokens: int) -> Attribution:
    """For results without ``kv_sources``: the cached part as local, the rest unknown."""
    c = max(0, min(cached_tokens, prompt_tokens))
    return Attribution(
        prompt_tokens, c, computed_tokens=prompt_tokens - c,
        miss_reasons={UNKNOWN: prompt_tokens - c} if prompt_tokens > c else {},
    )  # fmt: skip


def tracking_index(memory: EvictionMemory) -> Any:
    """The proxy's KV index, remembering in ``memory`` every block that leaves a holder (an
    instance's cache evicted it, the pool evicted or lost it, an instance went away) — so a
    later miss on it is ``evicted``, not ``never_seen``."""

    class _Tracking(PrefixIndex):
        evictions = memory

        def remove(self, holder: Any, blocks: Iterable[BlockHash]) -> None:
            blocks = list(blocks)
            super().remove(holder, blocks)
            memory.add(blocks)

    return _Tracking()


def extend_usage(usage: dict[str, Any], a: Attribution | None) -> None:
    """Add the ``kvcake`` extension object to an OpenAI ``usage`` (clients ignore it)."""
    if a is not None:
        usage["kvcake"] = a.as_dict()
