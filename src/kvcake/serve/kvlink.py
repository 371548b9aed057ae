"""Moving KV bytes of a request between this instance and the rest of the cluster.

* :class:`KVSender` streams layer ranges of local blocks into a decode instance's reserved
  blocks over the Transfer Engine (asynchronous submits; :meth:`KVSender.finish` waits for all).
* :class:`PoolLink` reads prefix blocks from and writes new blocks to the store (the pool).

Both work on the engine's ``block-layer-kv`` layout: layer ``l`` of block ``b`` is one contiguous
range ``b*block_bytes + l*layer_bytes``, so one layer of one block is one transfer request.
"""

from __future__ import annotations

import logging
import queue
import threading
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
        self.layer_compute_done: dict[int, float] = {}
        self.bytes_sent = 0
        # A waiter thread collects completions as they happen, so per-layer transfer times are
        # measured, not inflated by when ``finish`` gets round to them.
        self._pending: queue.SimpleQueue[tuple[int, float, int] | None] = queue.SimpleQueue()
        self._done: list[tuple[float, float, int, Any]] = []  # (submitted, done, layer, result)
        self._waiter = threading.Thread(target=self._wait_all, daemon=True, name="kv-sender")
        self._waiter.start()
        self.timeout_s = 60.0

    def _wait_all(self) -> None:
        while (item := self._pending.get()) is not None:
            bid, submitted, layer = item
            try:
                result: Any = self.engine.wait(bid, self.timeout_s)
            except Exception as exc:
                result = exc
            self._done.append((submitted, time.perf_counter(), layer, result))

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
        self._pending.put((self.engine.submit(reqs), time.perf_counter(), -1))

    def send_layer(self, layer: int, first: int) -> None:
        """Layer ``layer`` of blocks ``first..`` (the freshly computed part)."""
        now = time.perf_counter()
        self.layer_compute_done[layer] = now
        off, n = layer * self.layout.layer_bytes, len(self.local_blocks) - first
        if n <= 0:
            return
        reqs = [self._request(i, off, self.layout.layer_bytes) for i in range(first, first + n)]
        self.bytes_sent += n * self.layout.layer_bytes
        self._pending.put((self.engine.submit(reqs), now, layer))

    def cancel(self) -> None:
        """Stop the waiter after a failed prefill (in-flight writes finish on their own)."""
        self._pending.put(None)
        self._waiter.join(self.timeout_s)

    def finish(self) -> dict[str, float]:
        """Wait for every transfer; raise :class:`TransferError` if any failed. Returns timings
        for the overlap check: ``stream_gap_s`` (last layer computed -> all KV written) and
        per-layer transfer times (submit -> complete) of the layers before the last."""
        self._pending.put(None)
        self._waiter.join()
        for *_, result in self._done:
            if isinstance(result, Exception):
                raise TransferError(f"KV transfer to the decode instance failed: {result}")
            result.raise_for_errors()
        done_at = max((d for _, d, _, _ in self._done), default=time.perf_counter())
        last_compute = max(self.layer_compute_done.values(), default=done_at)
        layers = sorted((layer, d - s) for s, d, layer, _ in self._done if layer >= 0)
        out = {"kv_bytes_sent": float(self.bytes_sent)}
        if len(layers) >= 2:
            earlier = sorted(t for _, t in layers[:-1])
            out["layer_transfer_p50_s"] = earlier[len(earlier) // 2]
            out["layer_transfer_p90_s"] = earlier[min(len(earlier) - 1, int(len(earlier) * 0.9))]
            out["layer_transfer_max_s"] = earlier[-1]
            out["last_layer_transfer_s"] = layers[-1][1]
            out["stream_gap_s"] = max(0.0, done_at - last_compute)
            out["layers"] = float(len(layers))
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
        if not hashes:
            return 0
        try:
            got = self.client.batch_get_into([self.key(h) for h in hashes], list(views))
        except Exception as exc:  # the pool is unreachable: compute instead
            log.warning("pool read failed: %r", exc)
            return 0
        n = 0
        for g, v in zip(got, views, strict=True):
            if not isinstance(g, int) or g != v.nbytes:
                break  # a miss (evicted) or a foreign object: compute from here
            n += 1
        return n

    def put(self, hashes: Sequence[BlockHash], views: Sequence[memoryview]) -> list[BlockHash]:
        """Write blocks not yet in the pool. Returns the hashes the pool now holds."""
        keys = [self.key(h) for h in hashes]
        try:
            exist = self.client.batch_is_exist(keys)
            todo = [i for i, e in enumerate(exist) if not e]
            res = self.client.batch_put([keys[i] for i in todo], [views[i] for i in todo])
        except Exception as exc:
            log.warning("pool put failed: %r", exc)
            return []
        failed = {i for i, r in zip(todo, res, strict=True) if r is not None}
        return [h for i, h in enumerate(hashes) if i not in failed]
