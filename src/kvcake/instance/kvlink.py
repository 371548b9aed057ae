"""Moving KV bytes of a request between this instance and the rest of the cluster.

* :class:`KVLink` / :class:`KVSender` stream layer ranges of local blocks into a decode
  instance's reserved blocks over the Transfer Engine (asynchronous submits; one completion
  thread per decode peer; :meth:`KVSender.finish` / :meth:`KVSender.cancel` wait for all).
* :class:`PoolLink` reads prefix blocks from and writes new blocks to the store (the pool).

Both work on the engine's ``block-layer-kv`` layout: layer ``l`` of block ``b`` is one contiguous
range ``b*block_bytes + l*layer_bytes``, so one layer of one block is one transfer request.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from kvcake.core.api import KVReservation
from kvcake.core.errors import TransferError
from kvcake.core.hashing import block_key
from kvcake.core.ids import BlockHash, SegmentName
from kvcake.core.stats import percentile
from kvcake.engine.kv_memory import KVLayout
from kvcake.serve import attribution
from kvcake.store.errors import LeaseExpired, ObjectNotFound
from kvcake.transfer import Op, TransferRequest

log = logging.getLogger(__name__)


# A write that failed with one of these found the peer's address dead or its segment gone: the
# engine dropped its cached entry, so one more try asks the directory where the (restarted)
# peer listens now.
_PEER_MOVED = {"NoPathAvailable", "UnknownSegment"}


class _Waiter:
    """One thread per decode peer that collects Transfer Engine completions in submit order and
    hands each to the sender that submitted it (one thread per peer, not per request)."""

    def __init__(self, engine: Any, name: str):
        self.engine = engine
        self._q: queue.SimpleQueue[tuple[Any, list[Any], float, int, KVSender] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._main, daemon=True, name=name)
        self._thread.start()

    def add(self, bid: Any, reqs: list[Any], submitted: float, layer: int,
            sender: KVSender) -> None:  # fmt: skip
        self._q.put((bid, reqs, submitted, layer, sender))

    def _main(self) -> None:
        while (item := self._q.get()) is not None:
            bid, reqs, submitted, layer, sender = item
            result = self._wait(bid, sender.timeout_s)
            if _peer_moved(result):  # writes are idempotent: the whole batch again, once
                log.info("KV write to a moved peer: looking it up again and retrying once")
                try:
                    result = self._wait(self.engine.submit(reqs), sender.timeout_s)
                except Exception as exc:
                    result = exc
            sender._completed(submitted, time.perf_counter(), layer, result)

    def _wait(self, bid: Any, timeout_s: float) -> Any:
        try:
            return self.engine.wait(bid, timeout_s)
        except Exception as exc:
            return exc

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(5)


class KVLink:
    """An instance's outgoing KV streams: one completion waiter per decode peer (bounded by
    ``max_peers``; the least recently used one is retired when a new peer appears)."""

    def __init__(self, engine: Any, local_segment: SegmentName, layout: KVLayout,
                 max_peers: int = 64):  # fmt: skip
        self.engine, self.local, self.layout = engine, local_segment, layout
        self.max_peers = max_peers
        self._waiters: OrderedDict[str, _Waiter] = OrderedDict()
        self._mu = threading.Lock()

    def sender(self, local_blocks: Sequence[int], reservation: KVReservation) -> KVSender:
        with self._mu:
            w = self._waiters.pop(reservation.segment, None)
            if w is None:
                w = _Waiter(self.engine, f"kv-sender-{reservation.segment}")
                if len(self._waiters) >= self.max_peers:
                    # Queued completions of the old peer are still collected before it exits.
                    self._waiters.popitem(last=False)[1].close()
            self._waiters[reservation.segment] = w
        return KVSender(self.engine, self.local, self.layout, local_blocks, reservation, w)

    def close(self) -> None:
        with self._mu:
            for w in self._waiters.values():
                w.close()
            self._waiters.clear()


class KVSender:
    """Writes one request's KV into ``reservation`` (a decode instance's blocks).

    Not thread-safe: one prefill thread drives it. Timestamps (``time.perf_counter``) of every
    layer's compute end and transfer end are kept for the overlap check (``timings``).
    :meth:`finish` and :meth:`cancel` return only once every submitted write has an outcome —
    the fence an abort relies on: after them, this request writes nothing more."""

    def __init__(
        self,
        engine: Any,  # kvcake.transfer.TransferEngine
        local_segment: SegmentName,
        layout: KVLayout,
        local_blocks: Sequence[int],
        reservation: KVReservation,
        waiter: _Waiter,
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
        self.timeout_s = 60.0
        self._waiter = waiter
        self._cv = threading.Condition()
        self._submitted = 0
        self._done: list[tuple[float, float, int, Any]] = []  # (submitted, done, layer, result)

    def _completed(self, submitted: float, done: float, layer: int, result: Any) -> None:
        with self._cv:
            self._done.append((submitted, done, layer, result))
            self._cv.notify_all()

    def _submit(self, reqs: list[Any], now: float, layer: int) -> None:
        bid = self.engine.submit(reqs)
        self._submitted += 1
        self._waiter.add(bid, reqs, now, layer, self)

    def _request(self, i: int, offset_in_block: int, length: int) -> Any:
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
        self._submit(reqs, time.perf_counter(), -1)

    def send_layer(self, layer: int, first: int) -> None:
        """Layer ``layer`` of blocks ``first..`` (the freshly computed part)."""
        now = time.perf_counter()
        self.layer_compute_done[layer] = now
        off, n = layer * self.layout.layer_bytes, len(self.local_blocks) - first
        if n <= 0:
            return
        reqs = [self._request(i, off, self.layout.layer_bytes) for i in range(first, first + n)]
        self.bytes_sent += n * self.layout.layer_bytes
        self._submit(reqs, now, layer)

    def _wait_all(self, timeout: float) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: len(self._done) >= self._submitted, timeout)

    def cancel(self) -> bool:
        """After a failed or aborted prefill: wait until every submitted write has an outcome
        (no more bytes land in the reservation). False if some are still unresolved after the
        write timeout — the decode side then keeps the blocks fenced."""
        return self._wait_all(self.timeout_s + 5.0)

    def finish(self) -> dict[str, float]:
        """Wait for every transfer; raise :class:`TransferError` if any failed. Returns timings
        for the overlap check: ``stream_gap_s`` (last layer computed -> all KV written) and
        per-layer transfer times (submit -> complete) of the layers before the last."""
        if not self._wait_all(self.timeout_s + 5.0):
            raise TransferError("KV transfer to the decode instance did not complete")
        for *_, result in self._done:
            if isinstance(result, Exception):
                raise TransferError(f"KV transfer to the decode instance failed: {result}")
            result.raise_for_errors()
        done_at = max((d for _, d, _, _ in self._done), default=time.perf_counter())
        last_compute = max(self.layer_compute_done.values(), default=done_at)
        layers = sorted((layer, d - s) for s, d, layer, _ in self._done if layer >= 0)
        out = {"kv_bytes_sent": float(self.bytes_sent)}
        if len(layers) >= 2:
            earlier = [t for _, t in layers[:-1]]
            out["layer_transfer_p50_s"] = percentile(earlier, 50, method="higher")
            out["layer_transfer_p90_s"] = percentile(earlier, 90, method="higher")
            out["layer_transfer_max_s"] = max(earlier)
            out["last_layer_transfer_s"] = layers[-1][1]
            out["stream_gap_s"] = max(0.0, done_at - last_compute)
            out["layers"] = float(len(layers))
        return out


class PoolLink:
    """The store (the global KV pool): whole blocks under ``core.hashing.block_key`` names."""

    FETCH_CHUNK = 8  # blocks per read when a fetch deadline is set (checked between reads)

    def __init__(
        self, client: Any, model: str, dtype: str, block_tokens: int, fetch_deadline_s: float = 0.0
    ):
        self.client = client  # kvcake.store.Client
        self.model, self.dtype, self.block_tokens = model, dtype, block_tokens
        # A prefix read still going after this long stops (the rest is computed, reported as
        # ``too_slow``): a slow pool must not cost more than computing. 0 = no deadline.
        self.fetch_deadline_s = fetch_deadline_s

    def key(self, h: BlockHash) -> str:
        return str(block_key(self.model, self.dtype, self.block_tokens, h))

    def get_into(self, hashes: Sequence[BlockHash], views: Sequence[memoryview]) -> int:
        """Read blocks in order into ``views``; stops at the first miss. Returns blocks read."""
        return sum(self.read_prefix(hashes, views)[0].values())

    def read_prefix(
        self, hashes: Sequence[BlockHash], views: Sequence[memoryview]
    ) -> tuple[dict[str, int], dict[str, int]]:
        """Like :meth:`get_into`, saying what happened (``serve.attribution`` keys): blocks
        read per replica source (``memory:<segment>`` / ``disk:<segment>``), and the blocks
        not read (from the first miss on) under the kind of that miss."""
        read: dict[str, int] = {}
        if not hashes:
            return read, {}
        step = self.FETCH_CHUNK if self.fetch_deadline_s > 0 else len(hashes)
        t0 = time.monotonic()
        for start in range(0, len(hashes), step):
            if start and time.monotonic() - t0 > self.fetch_deadline_s:
                return read, {attribution.FETCH_TOO_SLOW: len(hashes) - start}
            missed = self._read_chunk(hashes[start : start + step], views[start : start + step],
                                      read)  # fmt: skip
            if missed:  # the chunk's unread blocks and every later one
                kind, n = missed
                return read, {kind: n + max(0, len(hashes) - start - step)}
        return read, {}

    def _read_chunk(
        self, hashes: Sequence[BlockHash], views: Sequence[memoryview], read: dict[str, int]
    ) -> tuple[str, int] | None:
        """Read one chunk, counting blocks per source into ``read``; on a miss: (its kind,
        blocks of the chunk not read)."""
        reps: list[Any] = []
        try:
            got = self.client.batch_get_into([self.key(h) for h in hashes], list(views), reps)
        except Exception as exc:  # the pool is unreachable: compute instead
            log.warning("pool read failed: %r", exc)
            return attribution.FETCH_FAILED, len(hashes)
        for i, (g, v) in enumerate(zip(got, views, strict=True)):
            if not isinstance(g, int) or g != v.nbytes:  # compute from here
                return _miss_kind(g), len(hashes) - i
            rep = reps[i] if i < len(reps) else None
            src = attribution.pool_source(rep.tier, rep.segment) if rep else "memory:?"
            read[src] = read.get(src, 0) + 1
        return None

    def put(
        self, hashes: Sequence[BlockHash], views: Sequence[memoryview], tenant: str = ""
    ) -> list[BlockHash]:
        """Write blocks not yet in the pool (charged to ``tenant``'s quota, if any). Returns
        the hashes the pool now holds."""
        keys = [self.key(h) for h in hashes]
        try:
            exist = self.client.batch_is_exist(keys)
            todo = [i for i, e in enumerate(exist) if not e]
            res = self.client.batch_put(
                [keys[i] for i in todo], [views[i] for i in todo], tenant=tenant or None
            )
        except Exception as exc:
            log.warning("pool put failed: %r", exc)
            return []
        failed = {i for i, r in zip(todo, res, strict=True) if r is not None}
        return [h for i, h in enumerate(hashes) if i not in failed]


def _peer_moved(result: Any) -> bool:
    results = getattr(result, "results", ())
    return any(not r.ok and r.error_type in _PEER_MOVED for r in results)


def _miss_kind(result: Any) -> str:
    """The ``serve.attribution`` kind of a pool read that did not return a block."""

    if isinstance(result, ObjectNotFound):
        return attribution.FETCH_NOT_FOUND
    if isinstance(result, LeaseExpired):
        return attribution.FETCH_TOO_SLOW
    return attribution.FETCH_FAILED
