"""What each vLLM engine holds, from its KV events, in kvcake's block names.

vLLM publishes ``EventBatch(ts, events, dp_rank)`` over zmq (``--kv-events-config``); a
``BlockStored`` carries vLLM's own block hashes, its parent hash *and the token ids*. vLLM's
hashes are never put into the index: each stored run is re-hashed with kvcake's chained hash
(``core.hashing``) from its token ids, chained onto the kvcake hash of its parent, and the
vLLM -> kvcake map (bounded by the blocks the engine holds: entries leave with
``BlockRemoved``) translates later removals. A parent the map does not know (events lost
before we subscribed) cannot be chained: that run is skipped, the engine simply looks colder.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvcake.core.api import KVIndex
from kvcake.core.hashing import ROOT_HASH, block_hashes
from kvcake.core.ids import BlockHash, InstanceId

VllmHash = bytes | int


class _Stored(msgspec.Struct, tag="BlockStored", forbid_unknown_fields=False):
    block_hashes: list[VllmHash]
    parent_block_hash: VllmHash | None
    token_ids: list[int]
    block_size: int
    medium: str | None = None


class _Removed(msgspec.Struct, tag="BlockRemoved", forbid_unknown_fields=False):
    block_hashes: list[VllmHash]
    medium: str | None = None


class _Cleared(msgspec.Struct, tag="AllBlocksCleared", forbid_unknown_fields=False):
    pass


class _Batch(msgspec.Struct, array_like=True, forbid_unknown_fields=False):
    ts: float
    events: list[Any]  # tagged maps; unknown kinds (newer vLLM) are ignored
    data_parallel_rank: int | None = None


_DECODER = msgspec.msgpack.Decoder(_Batch)
_KINDS: dict[str, type[Any]] = {
    "BlockStored": _Stored,
    "BlockRemoved": _Removed,
    "AllBlocksCleared": _Cleared,
}


class EngineEvents:
    """Applies one engine's event batches to a shared :class:`KVIndex` under ``holder``."""

    def __init__(self, index: KVIndex, holder: InstanceId, block_tokens: int, max_blocks: int):
        self.index = index
        self.holder = holder
        self.block_tokens = block_tokens
        self.max_blocks = max_blocks
        self._map: dict[VllmHash, BlockHash] = {}
        self.skipped = 0
        self.bad_batches = 0

    def apply(self, payload: bytes) -> None:
        """Apply one zmq payload; a malformed one is counted and ignored (never raises)."""
        try:
            batch = _DECODER.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.bad_batches += 1
            return
        for raw in batch.events:
            kind = _KINDS.get(raw.get("type", "")) if isinstance(raw, dict) else None
            if kind is None:
                continue
            try:
                ev = msgspec.convert(raw, kind)
            except msgspec.ValidationError:
                self.bad_batches += 1
                continue
            if isinstance(ev, _Stored):
                self._stored(ev)
            elif isinstance(ev, _Removed):
                gone = [self._map.pop(h) for h in ev.block_hashes if h in self._map]
                self.index.remove(self.holder, gone)
            elif isinstance(ev, _Cleared):
                self.clear()

    def _stored(self, ev: _Stored) -> None:
        if ev.medium not in (None, "GPU") or ev.block_size != self.block_tokens:
            return  # offloaded copies and foreign block sizes are not this engine's KV
        if ev.parent_block_hash is None:
            parent = ROOT_HASH
        elif ev.parent_block_hash in self._map:
            parent = self._map[ev.parent_block_hash]
        else:
            self.skipped += len(ev.block_hashes)
            return
        ours = block_hashes(ev.token_ids, self.block_tokens, parent)
        if len(ours) != len(ev.block_hashes) or len(self._map) + len(ours) > self.max_blocks:
            self.skipped += len(ev.block_hashes)
            return
        self._map.update(zip(ev.block_hashes, ours, strict=True))
        self.index.add(self.holder, ours)

    def clear(self) -> None:
        self.index.drop_holder(self.holder)
        self._map.clear()

    def __len__(self) -> int:
        return len(self._map)
