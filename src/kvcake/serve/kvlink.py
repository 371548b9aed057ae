"""Moving KV bytes of a request between this instance and the rest of the cluster.

* :class:`KVSender` streams layer ranges of local blocks into a decode instance's reserved
  blocks over the Transfer Engine (asynchronous submits; :meth:`KVSender.finish` waits for all).
* :class:`PoolLink` reads prefix blocks from and writes new blocks to the store (the pool).

Both work on the engine's ``block-layer-kv`` layout: layer ``l`` of block ``b`` is one contiguous
range ``b*block_bytes + l*layer_bytes``, so one layer of one block is one transfer request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from kvcake.core.api import KVReservation
from kvcake.core.errors import TransferError
from kvcake.core.hashing import block_key
from kvcake.core.ids import BlockHash, SegmentName
from kvcake.engine.kv_memory import KVLayout

log = logging.getLogger(__name__)


class KVSender:
    """Writes one request's KV into ``reservation`` (a decode instance's blocks).

    Not thread-safe: one prefill thread drives it. Timestamps (``time.perf_counter``) of every
    layer's compute end and transfer end are kept for the overlap check (``timings``)."""

    def __init__(
        self,
        engine: Any,  # kvcake.transfer.TransferEngine
        local_segment: SegmentName,
        layout: KVLayout,
        local_blocks: Sequence[int],
        reservation: KVReservation,
    ):
        if reservation.block_bytes != layout.block_bytes or (
            reservation.layer_bytes != layout.layer_bytes
        ):
            raise TransferError(
                f"decode KV layout ({reservation.block_bytes} B/block) differs from prefill's "
                f"({layout.block_bytes} B/block): instances must run the same model and block size"
            )
        if len(reservation.block_ids) < len(local_blocks):
            raise TransferError(
                f"decode reserved {len(reservation.block_ids)} blocks, prompt needs "
                f"{len(local_blocks)}"
            )
        self.engine = engine
        self.local = local_segment
        self.layout = layout
        self.local_blocks = list(local_blocks)
        self.res = reservation
        self.batches: list[tuple[int, float, int]] = []  # (batch id, submit time, layer or -1)
        self.layer_compute_done: dict[int, float] = {}
        self.bytes_sent = 0

    def _request(self, i: int, offset_in_block: int, length: int) -> Any:
        from kvcake.transfer import Op, TransferRequest

        lb, rb = self.local_blocks[i], self.res.block_ids[i]
        return TransferRequest(
            Op.WRITE,
            self.local,
            lb * self.layout.block_bytes + offset_in_block,
            self.res.segment,
            rb * self.layout.block_bytes + offset_in_block,
            length,
        )

    def send_blocks(self, first: int, count: int) -> None:
        """Whole blocks ``[first, first+count)`` of the prompt (reused prefix), all layers."""
        if count <= 0:
            return
        reqs = [self._request(i, 0, self.layout.block_bytes) for i in range(first, first + count)]
        self.bytes_sent += count * self.layout.block_bytes
        self.batches.append((self.engine.submit(reqs), time.perf_counter(), -1))

    def send_layer(self, layer: int, first: int) -> None:
        """Layer ``layer`` of blocks ``first..`` (the freshly computed part)."""
        now = time.perf_counter()
        self.layer_compute_done[layer] = now
        off, n = layer * self.layout.layer_bytes, len(self.local_blocks) - first
        if n <= 0:
            return
        reqs = [self._request(i, off, self.layout.layer_bytes) for i in range(first, first + n)]
        self.bytes_sent += n * self.layout.layer_bytes
        self.batches.append((self.engine.submit(reqs), now, layer))

    def finish(self, timeout_s: float = 60.0) -> dict[str, float]:
        """Wait for every transfer; raise :class:`TransferError` if any failed. Returns timings:
        ``last_layer_done`` -> ``kv_complete`` gap and the mean per-layer transfer time."""
        layer_times: list[float] = []
        done_at = 0.0
        for bid, submitted, layer in self.batches:
            result = self.engine.wait(bid, timeout_s)
            t = time.perf_counter()
            result.raise_for_errors()
            done_at = max(done_at, t)
            if layer >= 0:
                layer_times.append(t - submitted)
        last_compute = max(self.layer_compute_done.values(), default=done_at)
        out = {"kv_bytes_sent": float(self.bytes_sent)}
        if layer_times:
            out["layer_transfer_s"] = sum(layer_times) / len(layer_times)
            out["last_layer_transfer_s"] = layer_times[-1]
            out["stream_gap_s"] = max(0.0, done_at - last_compute)
        return out


class PoolLink:
    """The store (the global KV pool): whole blocks under ``core.hashing.block_key`` names."""

    def __init__(self, client: Any, model: str, dtype: str, block_tokens: int):
        self.client = client  # kvcake.store.Client
        self.model, self.dtype, self.block_tokens = model, dtype, block_tokens

    def key(self, h: BlockHash) -> str:
        return str(block_key(self.model, self.dtype, self.block_tokens, h))

    def get_into(self, hashes: Sequence[BlockHash], views: Sequence[memoryview]) -> int:
        """Read blocks in order into ``views``; stops at the first miss. Returns blocks read."""
        n = 0
        for h, v in zip(hashes, views, strict=True):
            try:
                got = self.client.get_into(self.key(h), v)
            except Exception as exc:  # a miss or a vanished replica: compute from here
                log.debug("pool miss for %016x: %r", int(h), exc)
                break
            if isinstance(got, int) and got != v.nbytes:
                break
            n += 1
        return n

    def put(self, hashes: Sequence[BlockHash], views: Sequence[memoryview]) -> int:
        """Write blocks (skipping ones already there). Returns blocks written."""
        n = 0
        for h, v in zip(hashes, views, strict=True):
            key = self.key(h)
            try:
                if self.client.is_exist(key):
                    continue
                self.client.put_from(key, v)
                n += 1
            except Exception as exc:
                log.info("pool put of %s failed: %r", key, exc)
        return n
