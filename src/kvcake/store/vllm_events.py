"""The master's KV events in vLLM's wire format, for other routers (Dynamo's indexer, llm-d,
Mooncake's Conductor): docs/integrations/routers.md. Where it binds: ``events_policy.py``.

One event model underneath: kvcake's :class:`~kvcake.core.api.StoreEvent` stream (``events.py``)
is translated here, per block, into ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``.
Only blocks whose writer told the master their parent and token ids (a ``BlockInfo`` request,
:class:`BlockTable`) are published: a router re-hashes the token ids, so a ``BlockStored``
without them is useless. Objects written without (the Mooncake shim, LMCache, SGLang, any
key that is not a kvcake block key) are not published in this format.

Transport (vLLM's ``ZmqEventPublisher``): PUB frames ``[topic, seq (8 bytes big-endian),
msgpack [ts, [events], dp_rank]]``; a ROUTER replay socket answers a start seq with the
buffered ``(topic, seq, payload)`` from there on and ends with seq -1. A publisher (one master
run, e.g. after a failover) starts a new sequence (above any older one) with
``AllBlocksCleared``: consumers drop what an older master told them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import msgspec
import zmq

from kvcake.core.api import StoreEvent, StoreEventKind
from kvcake.core.hashing import block_hashes, parse_block_key
from kvcake.store import protocol as P
from kvcake.store.protocol import BlockMeta

if TYPE_CHECKING:  # annotation only: the master imports this module and needs no client
    from kvcake.store.client import Client

log = logging.getLogger(__name__)
END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM = {"memory": "CPU", "disk": "STORAGE", "file": "STORAGE"}  # vLLM's medium names
# A new publisher's first batch waits for its first subscriber, then this long for the others
# (after a failover every router reconnects at once).
FIRST_GRACE_S = 0.5
MAX_HELD = 16384  # events held until then; beyond, the oldest are dropped
MAX_TOKENS = 4096  # per block: a larger "block" is refused (bounds the table)


class _Event(msgspec.Struct, tag_field="type", tag=True, omit_defaults=True, gc=False):
    """vLLM 0.32's ``KVCacheEvent``: a map tagged by ``type``."""


class BlockStored(_Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None  # required by vLLM's decoder, so never omitted
    medium: str | None
    lora_name: str | None


class BlockRemoved(_Event):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(_Event):
    pass


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


ENCODER = msgspec.msgpack.Encoder()


class BlockTable:
    """Block hash -> (parent hash or None, token ids), as writers announced them, plus the
    media each block was published in. Bounded (LRU): a block that fell out is simply not
    published any more (a router then misses it, never mis-scores it)."""

    def __init__(self, capacity: int = 65536):
        self.capacity = capacity
        self._lock = threading.Lock()
        self._map: OrderedDict[int, tuple[int | None, tuple[int, ...], set[str]]] = OrderedDict()

    def learn(self, h: int, parent: int | None, tokens: Iterable[int]) -> None:
        for v in (h, parent):
            if v is not None and not 0 <= v < 2**64:
                raise ValueError(f"block hashes are unsigned 64-bit, got {v}")
        toks = tuple(tokens)
        if not 0 < len(toks) <= MAX_TOKENS:
            raise ValueError(f"a block has 1..{MAX_TOKENS} token ids, got {len(toks)}")
        with self._lock:
            old = self._map.pop(h, None)
            self._map[h] = (parent, toks, old[2] if old else set())
            if len(self._map) > self.capacity:
                self._map.popitem(last=False)

    def stored(self, h: int, medium: str) -> tuple[int | None, tuple[int, ...]] | None:
        """The block's (parent, tokens) if known and not yet published in ``medium``."""
        with self._lock:
            entry = self._map.get(h)
            if entry is None or medium in entry[2]:
                return None
            entry[2].add(medium)
            return entry[0], entry[1]

    def removed(self, h: int, media: Iterable[str]) -> list[str]:
        """The media of ``media`` the block was published in, now forgotten."""
        with self._lock:
            entry = self._map.get(h)
            if entry is None:
                return []
            gone = [m for m in media if m in entry[2]]
            entry[2].difference_update(gone)
            return gone

    def __len__(self) -> int:
        return len(self._map)


def lineage(tokens: Sequence[int], block_tokens: int, salt: str = "") -> list[BlockMeta]:
    """What a writer announces for a prompt's full blocks (``core.hashing``'s chain): the
    first block's parent is None (the salted root is no block a router knows)."""
    hashes = block_hashes(tokens, block_tokens, salt=salt)
    parents: list[int | None] = [None, *(int(h) for h in hashes[:-1])]
    return [
        BlockMeta(int(h), p, list(tokens[i * block_tokens : (i + 1) * block_tokens]))
        for i, (h, p) in enumerate(zip(hashes, parents, strict=True))
    ]


def announce(client: Client, blocks: list[BlockMeta]) -> None:
    """Tell the master the blocks' lineage (a ``BlockInfo`` request) before putting them; a
    refusal is logged, never raised: the put itself does not depend on it."""

    reply = client.conn.call(P.BlockInfo(client.id, blocks))
    if reply.code:
        log.warning("master refused the blocks' lineage: %s", reply.message)


def _blocks(keys: Iterable[str]) -> list[int]:
    """Block hashes of ``keys`` named once per block (rank 0's object stands for the block)."""
    out = []
    for k in keys:
        parsed = parse_block_key(k)
        if parsed is not None and parsed[1] == 0:
            out.append(int(parsed[0]))
    return out


def translate(events: Iterable[StoreEvent], table: BlockTable) -> list[_Event]:
    """vLLM events for a batch of kvcake events (what is not publishable is left out)."""
    out: list[_Event] = []
    for ev in events:
        if ev.kind is StoreEventKind.STORED:
            medium = MEDIUM.get(ev.tier, "CPU")
            for h in _blocks(ev.keys):
                known = table.stored(h, medium)
                if known is not None:
                    parent, toks = known
                    out.append(BlockStored([h], parent, list(toks), len(toks), None, medium, None))
            continue
        if ev.kind is StoreEventKind.REMOVED:
            media: tuple[str, ...] = ("CPU", "STORAGE")
        else:
            media = (MEDIUM.get(ev.tier, "CPU"),)
        for h in _blocks(ev.keys):
            for m in table.removed(h, media):
                out.append(BlockRemoved([h], m))
    return out


class VllmEventStream:
    """PUB ``tcp://host:port`` (0 = a free port) plus a ROUTER replay socket on the next free
    port, fed with kvcake event batches by :meth:`offer` (from the master's event thread).
    Bounded: ``max_batches`` queued (beyond: dropped, a gap the consumer can replay or not),
    ``replay_batches`` kept for replay."""

    def __init__(
        self,
        table: BlockTable,
        host: str = "127.0.0.1",
        port: int = 0,
        topic: str = "kv-events",
        replay_batches: int = 4096,
        max_batches: int = 1024,
    ):
        self.table = table
        self._topic = topic.encode()
        # A private context: stop() terms it, which returns only once zmq's I/O thread has
        # closed the sockets. close() alone hands that to the I/O thread, and a master
        # restarted on the same fixed port then failed to bind ("Address already in use",
        # 38 of 300 immediate rebinds here).
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._pub = self._ctx.socket(zmq.XPUB)  # XPUB: it tells when the first subscriber came
        self._replay = self._ctx.socket(zmq.ROUTER)
        for s in (self._pub, self._replay):
            s.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        if port:
            self._pub.bind(f"tcp://{host}:{port}")
        else:
            self._pub.bind_to_random_port(f"tcp://{host}")
        self._replay.bind_to_random_port(f"tcp://{host}")
        self.address = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_address = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self._in: queue.Queue[list[StoreEvent]] = queue.Queue(max_batches)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=replay_batches)
        # Last sent. A new publisher's sequence starts at the wall clock in microseconds, above
        # any older publisher's (at most a few hundred batches a second): a consumer that saw an
        # older master sees a forward gap, which it accepts (Dynamo does; a restart at 0 it took
        # for old duplicates and dropped), not a step back.
        self.seq = time.time_ns() // 1000 - 1
        self.dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="master-vllm-events", daemon=True)
        # A new publisher makes consumers forget what an older one said: its first batch
        # starts with AllBlocksCleared. Sent at bind time it would reach no one (subscribers,
        # reconnecting after a failover, are not there yet): it waits for a subscriber.
        self._cleared = False
        self._first_sub: float | None = None
        self._held: deque[_Event] = deque(maxlen=MAX_HELD)

    def start(self) -> None:
        self._thread.start()

    def offer(self, batch: list[StoreEvent]) -> None:
        try:
            self._in.put_nowait(batch)
        except queue.Full:
            self.dropped += len(batch)

    def _send(self, events: list[_Event]) -> None:
        self.seq += 1
        payload = ENCODER.encode(EventBatch(time.time(), events))  # type: ignore[arg-type]
        self._pub.send_multipart([self._topic, self.seq.to_bytes(8, "big"), payload])
        self._buffer.append((self.seq, payload))

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._replay.poll(0):
                self._serve_replay()
            self._note_subscribers()
            try:
                batch = self._in.get(timeout=0.05)
            except queue.Empty:
                batch = []
            try:
                events = translate(batch, self.table)
                if not self._cleared:
                    events = self._hold_until_subscribed(events)
                if events:
                    self._send(events)
            except Exception:  # one bad batch must not stop the stream
                log.exception("master: vLLM-format events: a batch failed")

    def _note_subscribers(self) -> None:
        while self._pub.poll(0):
            msg = self._pub.recv()
            if msg[:1] == b"\x01" and self._first_sub is None:
                self._first_sub = time.monotonic()

    def _hold_until_subscribed(self, events: list[_Event]) -> list[_Event]:
        """Before the first batch: hold events (bounded) until a subscriber has been there
        FIRST_GRACE_S; then everything held, after AllBlocksCleared."""
        self._held.extend(events)
        first = self._first_sub
        if first is None or time.monotonic() - first < FIRST_GRACE_S:
            return []
        self._cleared = True
        out: list[_Event] = [AllBlocksCleared(), *self._held]
        self._held.clear()
        return out

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("master: malformed KV-event replay request (%d frames)", len(frames))
            return
        ident, start = frames[0], int.from_bytes(frames[2], "big", signed=True)
        for seq, payload in list(self._buffer):
            if seq >= start:
                self._replay.send_multipart(
                    [ident, b"", self._topic, seq.to_bytes(8, "big"), payload]
                )
        self._replay.send_multipart([ident, b"", b"", END_SEQ, b""])

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._pub.close(0)
        self._replay.close(0)
        self._ctx.term()  # returns once the port is free (see __init__)
