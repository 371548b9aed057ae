"""The master's KV events: :class:`EventLog` numbers pool changes as the state applies them
(under the state lock, so ``seq`` order is the order of the changes) and keeps a bounded queue;
:class:`EventPublisher` sends the queue on a zmq PUB socket (where: ``events_policy.py``;
with a shared secret, CURVE-encrypted and only for subscribers holding it).

Message: two frames, :data:`~kvcake.core.api.STORE_EVENTS_TOPIC` and a msgpack list of
:class:`~kvcake.core.api.StoreEvent` (several events per message when they queue up). When idle
for a second: topic ``<topic>.tick`` and msgpack ``[publisher, last seq]``, so a subscriber
that missed the last events notices without waiting for the next change. When the
queue overflows (no one drains it fast enough) the oldest events are dropped: subscribers see a
gap in ``seq`` and resynchronise from a snapshot, as they would after a missed message.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import msgspec
import zmq

from kvcake.core.api import STORE_EVENTS_TOPIC, StoreEvent, StoreEventKind
from kvcake.core.zmq_curve import CurveServer

if TYPE_CHECKING:
    from kvcake.core.auth import Authenticator

log = logging.getLogger(__name__)
_now = time.time
ENCODER = msgspec.msgpack.Encoder()
BATCH_DECODER = msgspec.msgpack.Decoder(list[StoreEvent])
MAX_BATCH = 1024  # events per zmq message
TICK_TOPIC = STORE_EVENTS_TOPIC + b".tick"  # idle: msgpack [publisher, last seq] once a second
TICK_S = 1.0
BATCH_WAIT_S = 0.01
_SEGMENT_LOST = StoreEventKind.SEGMENT_LOST  # enum attribute lookups are slow on hot paths


class EventLog:
    """Thread-safe append side (the state calls :meth:`emit` under its own lock)."""

    def __init__(self, maxlen: int = 65536, publisher: str = ""):
        self.publisher = publisher or f"master-{secrets.token_hex(6)}"
        self.seq = 0  # last assigned
        self.dropped = 0
        # Raw tuples (seq, kind, keys, tier, segment, time): StoreEvent objects are built by
        # the publisher thread, off the RPC path.
        self._queue: deque[tuple[int, StoreEventKind, tuple[str, ...], str, str, float]] = deque()
        self._maxlen = maxlen
        # emit() takes the plain lock (a C call) rather than the Condition's Python-level
        # __enter__/__exit__: it runs on every mutating RPC, the publisher waits rarely.
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._waiting = False  # the publisher sleeps on _cv: only then is it worth a wake-up
        self.enabled = True

    def emit(
        self, kind: StoreEventKind, keys: Iterable[str], tier: str = "", segment: str = ""
    ) -> None:
        ks = keys if type(keys) is tuple else tuple(keys)
        if not ks and kind is not _SEGMENT_LOST:
            return
        with self._lock:
            self.seq = seq = self.seq + 1
            if not self.enabled:
                return
            queue = self._queue
            queue.append((seq, kind, ks, tier, segment, _now()))
            if len(queue) > self._maxlen:
                queue.popleft()
                self.dropped += 1
            if self._waiting:
                self._cv.notify()

    def take(self, timeout: float, limit: int = MAX_BATCH) -> list[StoreEvent]:
        with self._cv:
            if not self._queue:
                self._waiting = True
                self._cv.wait(timeout)
                self._waiting = False
            n = min(limit, len(self._queue))
            raw = [self._queue.popleft() for _ in range(n)]
        pub = self.publisher
        return [StoreEvent(s, pub, k, ks, t, seg, ts) for s, k, ks, t, seg, ts in raw]

    def wake(self) -> None:
        with self._cv:
            self._cv.notify_all()


class EventPublisher:
    """A thread sending :class:`EventLog` batches on ``tcp://host:port`` (0 = a free port).
    With ``auth`` (the shared secret) the socket is a CURVE server that admits only
    subscribers holding the secret (``core/zmq_curve.py``); it refuses to start without CURVE
    support rather than publish in plaintext."""

    def __init__(
        self,
        events: EventLog,
        host: str = "127.0.0.1",
        port: int = 0,
        auth: Authenticator | None = None,
        sinks: Iterable[Callable[[list[StoreEvent]], None]] = (),
    ):
        self.events = events
        # Other consumers of every batch (the vLLM-format stream, store/vllm_events.py): one
        # event model, several wire formats. port < 0: sinks only, no socket of its own.
        self.sinks = list(sinks)
        self._own = port >= 0
        self._curve = CurveServer(auth) if auth is not None and self._own else None
        # Its own context either way: stop() terms it, which returns only once the port is
        # free (a master restarted on a fixed port must be able to bind it at once).
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        if self._curve is not None:
            self._sock = self._curve.socket(zmq.PUB)
        else:
            self._ctx = zmq.Context()
            self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 10_000)  # messages; beyond, zmq drops -> a gap
        if not self._own:
            self._sock.bind("inproc://kvcake-events-" + events.publisher)  # nothing listens
        elif port:
            self._sock.bind(f"tcp://{host}:{port}")
        else:
            self._sock.bind_to_random_port(f"tcp://{host}")
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT) if self._own else ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="master-events", daemon=True)
        self.sent = 0

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            batch = self.events.take(0.2)
            if not batch:
                if time.monotonic() - last >= TICK_S:  # lets idle subscribers notice a loss
                    last = time.monotonic()
                    tick = ENCODER.encode([self.events.publisher, self.events.seq])
                    self._sock.send_multipart([TICK_TOPIC, tick])
                continue
            last = time.monotonic()
            for sink in self.sinks:
                sink(batch)
            try:
                self._sock.send_multipart([STORE_EVENTS_TOPIC, ENCODER.encode(batch)])
                self.sent += len(batch)
            except Exception:  # a send failure must not stop the thread; subscribers resync
                log.exception("master: publishing %d events failed", len(batch))
            # Under a stream of changes, gather for a moment: one message and one wake-up
            # per BATCH_WAIT_S instead of one per event (the RPC threads need the CPU and
            # the GIL: at 2 ms the publisher cost the master ~10 µs per RPC under load).
            self._stop.wait(BATCH_WAIT_S)

    def stop(self) -> None:
        self._stop.set()
        self.events.wake()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._sock.close(0)
        if self._curve is not None:
            self._curve.close()
        if self._ctx is not None:
            self._ctx.term()
