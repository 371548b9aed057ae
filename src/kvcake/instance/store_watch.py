"""An instance's watch on the store master's events: it logs a storage node that leaves the pool
by name, once, as it happens ("storage node store-0 lost (segment store-0 unregistered, 12 keys
lost their memory copy)"), instead of the operator inferring it from failed reads.

One daemon thread: it asks the master for its event address (a ``Heartbeat`` probe), subscribes
(zmq SUB, loopback as the master binds it) and reacts to ``SEGMENT_LOST`` only — the instance
does not index the pool (the proxy does, serve.pool_events). A master away or restarted means
resubscribing after a pause; ``close`` stops the thread within one poll interval. ``lost`` keeps
the last few losses (bounded) for status pages and tests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import zmq

from kvcake.core.api import STORE_EVENTS_TOPIC, StoreEvent, StoreEventKind
from kvcake.core.auth import resolve
from kvcake.core.zmq_curve import secure_subscriber
from kvcake.store import protocol as P
from kvcake.store.events import BATCH_DECODER
from kvcake.store.ha.resolve import connect

log = logging.getLogger(__name__)
POLL_MS = 250
RETRY_S = 1.0


def node_of(segment: str) -> str:
    """The storage node a segment belongs to: ``store-0`` for ``store-0`` and its disk segment
    ``store-0.ssd`` (a ``kv/`` style prefix is kept out of the node name)."""
    return segment.rpartition("/")[2].removesuffix(".ssd")


def describe(ev: StoreEvent) -> str:
    tier = ev.tier or "memory"
    return (f"storage node {node_of(ev.segment)} lost (segment {ev.segment} unregistered, "
            f"{len(ev.keys)} keys lost their {tier} copy)")  # fmt: skip


class StoreWatch:
    def __init__(self, master: str, who: str = "instance", keep: int = 32) -> None:
        self.master = master  # host:port of the master RPC, or etcd://...
        self.who = who
        self.lost: deque[tuple[float, str, str]] = deque(maxlen=keep)  # (time, node, segment)
        self.subscribed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-watch", daemon=True)

    def start(self) -> StoreWatch:
        self._thread.start()
        return self

    def close(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def on_event(self, ev: StoreEvent) -> None:
        if ev.kind is StoreEventKind.SEGMENT_LOST and ev.segment:
            self.lost.append((time.time(), node_of(ev.segment), ev.segment))
            log.warning("%s", describe(ev))

    # --- the thread ---------------------------------------------------------------------------

    def _address(self) -> str:
        conn = connect(self.master, timeout_s=5.0)
        try:
            return str(conn.call(P.Heartbeat("", self.who)).events)
        finally:
            conn.close()

    def _run(self) -> None:
        ctx: Any = zmq.Context.instance()
        warned = False
        while not self._stop.is_set():
            try:
                address = self._address()
            except Exception as exc:  # master away: retry quietly after the first warning
                if not warned:
                    log.warning("store watch: master %s unreachable: %s", self.master, exc)
                    warned = True
                self._stop.wait(RETRY_S)
                continue
            if not address:
                log.info("store watch: master %s publishes no events", self.master)
                return
            warned = False
            sock = ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, STORE_EVENTS_TOPIC)
            secure_subscriber(sock, resolve(None))  # CURVE with the shared secret's keys
            sock.connect(address)
            try:
                self._consume(sock, BATCH_DECODER)
            except Exception as exc:
                log.warning("store watch: %r; resubscribing", exc)
                self._stop.wait(RETRY_S)
            finally:
                sock.close(0)

    def _consume(self, sock: Any, decoder: Any) -> None:
        silent = 0.0
        self.subscribed.set()
        while not self._stop.is_set():
            if not sock.poll(POLL_MS):
                silent += POLL_MS / 1000
                if silent >= 5.0:  # no tick for 5 s: the master went away (or restarted)
                    raise ConnectionError("no store events or ticks for 5 s")
                continue
            silent = 0.0
            topic, payload = sock.recv_multipart()
            if topic == STORE_EVENTS_TOPIC:
                for ev in decoder.decode(payload):
                    self.on_event(ev)
