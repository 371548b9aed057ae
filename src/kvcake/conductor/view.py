"""Per-request view of the prefill instances: the arrays every prefill policy ranks with.

:class:`ViewBuilder` turns ``(RequestView, ClusterSnapshot)`` into a :class:`PrefillView` with
one entry per prefill instance (snapshot order): health, queue seconds, fetch bandwidth, local
prefix length (blocks) and the best prefix anywhere. Things that depend only on the set of
instance ids (position map, bit positions in a :class:`PrefixIndex`, duplicate check) are cached
per id tuple, so a decision costs one prefix match plus a few numpy operations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvcake.conductor.index import PrefixIndex
from kvcake.conductor.predictors import Predictors
from kvcake.core.api import ClusterSnapshot, PrefillState, RequestView
from kvcake.core.errors import SchedulingError
from kvcake.core.ids import BlockHash, InstanceId

_INF = math.inf


@dataclass
class PrefillView:
    """Read-only for policies. ``local`` and ``best_len`` count blocks of ``request``."""

    request: RequestView
    ids: tuple[InstanceId, ...]
    healthy: np.ndarray  # bool
    queued: np.ndarray  # seconds
    bandwidth: np.ndarray  # bytes/s used to fetch into each instance
    local: np.ndarray  # int: leading request blocks each instance holds
    best_len: int  # longest prefix held by any usable holder
    best_holder: InstanceId | None
    block_tokens: int
    kv_bytes_per_token: int
    predictors: Predictors
    _ttft_local: np.ndarray | None = None

    @property
    def healthy_indices(self) -> np.ndarray:
        return np.flatnonzero(self.healthy)

    def _tokens(self, blocks: np.ndarray) -> np.ndarray:
        return np.minimum(blocks * self.block_tokens, self.request.prompt_len)

    def ttft_local(self) -> np.ndarray:
        """Queue + prefill using only each instance's own cache (inf when unhealthy)."""
        if self._ttft_local is None:
            pre = self.predictors.prefill.times(self.request.prompt_len, self._tokens(self.local))
            self._ttft_local = np.where(self.healthy, self.queued + pre, _INF)
        return self._ttft_local

    def ttft_global(self, threshold: float) -> tuple[np.ndarray, np.ndarray]:
        """Algorithm 1: an instance whose own prefix is much shorter than the best one
        (``best/local > threshold``, or local 0) fetches the missing blocks, then prefills with
        the best prefix. Returns (TTFT per instance, fetch flag per instance)."""
        local, best = self.local, self.best_len
        fetch = (best > local) & ((local == 0) | (best > threshold * local))
        if not fetch.any():
            return self.ttft_local(), fetch
        prefix_blocks = np.where(fetch, best, local)
        have, want = self._tokens(local), self._tokens(prefix_blocks)
        pre = self.predictors.prefill.times(self.request.prompt_len, want)
        nbytes = (want - have) * float(self.kv_bytes_per_token)
        xfer = self.predictors.transfer.times(nbytes, self.bandwidth)
        return np.where(self.healthy, self.queued + pre + xfer, _INF), fetch


@dataclass
class _IdTable:
    pos: dict[InstanceId, int]
    bits: np.ndarray | None = None  # bit per instance (-1 -> sentinel slot)
    bit_pos: np.ndarray | None = None  # snapshot position per bit (-1: not a prefill instance)
    num_bits: int = -1


class ViewBuilder:
    """Builds :class:`PrefillView` s; owns the per-id-tuple caches (not thread-safe)."""

    def __init__(self, predictors: Predictors) -> None:
        self.predictors = predictors
        self._tables: dict[tuple[InstanceId, ...], _IdTable] = {}

    def build(self, request: RequestView, snap: ClusterSnapshot) -> PrefillView:
        pre = snap.prefill
        ids = tuple(p.instance_id for p in pre)
        table = self._table(ids)
        queued, bandwidth, healthy = _instance_arrays(pre, snap.link_bandwidth)
        blocks = request.block_hashes
        index = snap.kv_index
        if isinstance(index, PrefixIndex):
            local, best_len, best = self._match_bits(index, table, blocks, healthy, ids)
        else:
            local, best_len, best = _match_generic(index, table, blocks, healthy, ids)
        return PrefillView(
            request, ids, healthy, queued, bandwidth, local, best_len, best,
            snap.block_tokens, snap.kv_bytes_per_token, self.predictors,
        )  # fmt: skip

    def _table(self, ids: tuple[InstanceId, ...]) -> _IdTable:
        table = self._tables.get(ids)
        if table is None:
            pos = {iid: i for i, iid in enumerate(ids)}
            if len(pos) != len(ids):
                dup = sorted({i for i in ids if ids.count(i) > 1})
                raise SchedulingError(f"snapshot lists prefill instance(s) twice: {dup}")
            if len(self._tables) > 64:  # membership churn: keep the cache small
                self._tables.clear()
            table = self._tables[ids] = _IdTable(pos)
        return table

    def _match_bits(
        self,
        index: PrefixIndex,
        table: _IdTable,
        blocks: tuple[BlockHash, ...],
        healthy: np.ndarray,
        ids: tuple[InstanceId, ...],
    ) -> tuple[np.ndarray, int, InstanceId | None]:
        nb = index.num_bits
        if table.num_bits != nb or table.bits is None or table.bit_pos is None:
            table.bits = np.array([index.bit_of(i) for i in ids], dtype=np.int64)
            table.bits[table.bits < 0] = nb  # the always-zero sentinel slot
            table.bit_pos = np.full(nb + 1, -1, dtype=np.int64)
            known = table.bits < nb
            table.bit_pos[table.bits[known]] = np.flatnonzero(known)
            table.num_bits = nb
        lens = np.array(index.match_lengths(blocks), dtype=np.int64)
        local = lens[table.bits]
        if not healthy.all():
            lens[table.bits[~healthy]] = 0  # an unhealthy instance is no fetch source
        best_len = int(lens.max())
        if best_len == 0:
            return local, 0, None
        cand = np.flatnonzero(lens == best_len)
        at = table.bit_pos[cand]
        if (at >= 0).any():
            return local, best_len, ids[int(at[at >= 0].min())]
        return local, best_len, min(index.holder_of_bit(int(b)) for b in cand)


def _instance_arrays(
    pre: tuple[PrefillState, ...], link_bandwidth: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(pre)
    if n == 0:
        e = np.zeros(0)
        return e, e, np.zeros(0, dtype=bool)
    rows = np.array([(p.queued_seconds, p.fetch_bandwidth, p.healthy) for p in pre], dtype=float)
    queued, bw, healthy = rows[:, 0], rows[:, 1], rows[:, 2] != 0
    if not ((queued >= 0) & (bw >= 0)).all() or not np.isfinite(rows).all():
        bad = [p.instance_id for p in pre if not (p.queued_seconds >= 0 and p.fetch_bandwidth >= 0)]
        raise SchedulingError(
            f"prefill instance(s) {bad or '?'}: queued_seconds and fetch_bandwidth must be "
            "finite and >= 0"
        )
    bandwidth = np.where(bw > 0, bw, link_bandwidth)
    return queued, bandwidth, healthy


def _match_generic(
    index: object,
    table: _IdTable,
    blocks: tuple[BlockHash, ...],
    healthy: np.ndarray,
    ids: tuple[InstanceId, ...],
) -> tuple[np.ndarray, int, InstanceId | None]:
    from kvcake.core.api import KVIndex

    if not isinstance(index, KVIndex):
        raise SchedulingError(f"snapshot.kv_index must be a KVIndex, got {type(index).__name__}")
    matches = index.prefix_matches(blocks)
    local = np.zeros(len(ids), dtype=np.int64)
    best_len, best_key = 0, (2, "")
    for holder, n in matches.items():
        i = table.pos.get(holder, -1)
        if i >= 0:
            local[i] = n
            if not healthy[i]:
                continue
        # Ties: healthy prefill instances in snapshot order first, then other holders by id.
        key = (0, f"{i:09d}") if i >= 0 else (1, str(holder))
        if n > best_len or (n == best_len and key < best_key):
            best_len, best_key = n, key
    if best_len == 0:
        return local, 0, None
    kind, tag = best_key
    return local, best_len, ids[int(tag)] if kind == 0 else InstanceId(tag)
