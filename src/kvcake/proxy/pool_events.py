"""The proxy's pool index fed by the store master's KV events (docs/store.md, "KV events").

:class:`PoolEvents` subscribes to the master's zmq PUB, keeps a :class:`~kvcake.core.api.
PoolView` of the pool's readable keys and mirrors the block keys among them
(``core.hashing.block_key`` names, and the vLLM connector's per-rank ``rank_key`` names) into a
:class:`~kvcake.core.api.KVIndex` under the holder :data:`~kvcake.serve.events.POOL`. The
index names a block once, by its hash: a block saved by N tensor-parallel ranks is N objects
and enters the index when all N are in the pool, and leaves it when the first one leaves. A sequence gap, a new publisher (master restart) or a tick
announcing events it did not see makes it reload a snapshot (``KvSnapshot`` RPC). So the index
shrinks when the pool evicts, and never drifts for longer than one resync.

Runs on the proxy's event loop (zmq.asyncio); the blocking RPCs go to a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from kvcake.core.api import STORE_EVENTS_TOPIC, KVIndex, PoolView
from kvcake.core.auth import resolve
from kvcake.core.hashing import parse_block_key
from kvcake.core.ids import BlockHash, InstanceId
from kvcake.core.zmq_curve import secure_subscriber
from kvcake.serve.events import POOL
from kvcake.store import protocol as P
from kvcake.store.events import BATCH_DECODER
from kvcake.store.ha.resolve import connect  # host:port, or etcd:// (follows the leader)

log = logging.getLogger(__name__)


def block_of(key: str) -> BlockHash | None:
    """The block hash of a ``{model}/{dtype}/{block_tokens}/{hash:016x}`` key, or of one rank's
    object of it (``.../tp{rank}of{size}``), else None."""
    parsed = parse_block_key(key)
    return parsed[0] if parsed is not None else None


class RankCount:
    """Which blocks have every rank's object in the pool, per TP size (a block may be pooled
    by engines of several TP sizes). Bounded by the keys in the pool (one entry per block,
    gone with its last object)."""

    def __init__(self) -> None:
        self._ranks: dict[BlockHash, dict[int, set[int]]] = {}  # block -> size -> ranks in

    def _whole(self, block: BlockHash) -> bool:
        return any(len(r) == n for n, r in self._ranks.get(block, {}).items())

    def change(self, key: str, present: bool) -> tuple[BlockHash | None, bool | None]:
        """Apply one object entering or leaving; returns its block and, when that changed
        whether the block is whole, the new answer (else None)."""
        parsed = parse_block_key(key)
        if parsed is None:
            return None, None
        block, rank, size = parsed
        before = self._whole(block)
        sizes = self._ranks.setdefault(block, {})
        if present:
            sizes.setdefault(size, set()).add(rank)
        else:
            sizes.get(size, set()).discard(rank)
            if not sizes.get(size, True):
                del sizes[size]
            if not sizes:
                del self._ranks[block]
        after = self._whole(block)
        return block, (after if after != before else None)


class PoolEvents:
    def __init__(self, index: KVIndex, master: str, holder: InstanceId = POOL):
        self.index = index
        self.master = master  # host:port of the master RPC, or etcd://...
        self.holder = holder
        self.view = PoolView()
        self.ranks = RankCount()
        self.resyncs = 0
        self.applied = 0
        self._conn: Any = None

    # --- blocking helpers (run in a thread) ---------------------------------------------------

    def _call(self, msg: Any) -> Any:
        if self._conn is None:
            self._conn = connect(self.master, timeout_s=10.0)
        return self._conn.call(msg)

    def _probe(self) -> str:
        return str(self._call(P.Heartbeat("", "proxy")).events)

    def _snapshot(self) -> Any:
        return self._call(P.KvSnapshot("proxy")).snapshot

    # --- applying -----------------------------------------------------------------------------

    def _mirror(self, entered: list[str], left: list[str]) -> None:
        now: dict[BlockHash, bool] = {}  # block -> whole after this change (the last wins)
        for keys, present in ((left, False), (entered, True)):
            for key in keys:
                block, whole = self.ranks.change(key, present)
                if block is not None and whole is not None:
                    now[block] = whole
        add = [b for b, whole in now.items() if whole]
        gone = [b for b, whole in now.items() if not whole]
        if add:
            self.index.add(self.holder, add)
        if gone:
            self.index.remove(self.holder, gone)

    async def resync(self) -> None:
        snap = await asyncio.to_thread(self._snapshot)
        entered, left = self.view.load(snap)
        self._mirror(entered, left)
        self.resyncs += 1

    def on_batch(self, payload: bytes) -> bool:
        """Apply one message; False when a resync is needed."""

        for ev in BATCH_DECODER.decode(payload):
            out = self.view.apply(ev)
            if out is None:
                return False
            self._mirror(*out)
            self.applied += 1
        return True

    def on_tick(self, payload: bytes) -> bool:
        publisher, seq = msgspec.msgpack.decode(payload)
        return bool(publisher == self.view.publisher and seq <= self.view.seq)

    # --- the loop -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Subscribe, resync, apply events until ``stop``; reconnects if the master is away."""

        ctx = zmq.asyncio.Context.instance()
        while not stop.is_set():
            try:
                address = await asyncio.to_thread(self._probe)
            except Exception as exc:  # master down: the index keeps what it has, retry
                log.warning("pool events: master %s unreachable: %s", self.master, exc)
                await _sleep_or_stop(stop, 1.0)
                continue
            if not address:
                log.warning("pool events: master %s publishes no events", self.master)
                return
            sock = ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, STORE_EVENTS_TOPIC)
            secure_subscriber(sock, resolve(None))  # CURVE with the shared secret's keys
            sock.connect(address)
            try:
                await self._consume(sock, stop)
            except Exception as exc:
                log.warning("pool events: %r; resubscribing", exc)
                await _sleep_or_stop(stop, 0.5)
            finally:
                sock.close(0)
        if self._conn is not None:
            self._conn.close()

    async def _consume(self, sock: Any, stop: asyncio.Event) -> None:
        await asyncio.sleep(0.1)  # zmq slow joiner: let the subscription reach the publisher
        await self.resync()
        silent = 0.0
        while not stop.is_set():
            if not await sock.poll(500):
                silent += 0.5
                if silent >= 5.0:  # no tick for 5 s: the master went away (or restarted)
                    raise ConnectionError("no events or ticks for 5 s")
                continue
            silent = 0.0
            topic, payload = await sock.recv_multipart()
            ok = self.on_batch(payload) if topic == STORE_EVENTS_TOPIC else self.on_tick(payload)
            if not ok:
                await self.resync()


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


_TASKS: set[asyncio.Task[None]] = set()  # keeps running subscribers referenced


def start(index: KVIndex, master: str, stop: asyncio.Event) -> PoolEvents:
    """Run a :class:`PoolEvents` on the current loop until ``stop`` (the proxy's hook)."""
    pe = PoolEvents(index, master)
    task = asyncio.get_running_loop().create_task(pe.run(stop))
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)
    return pe
