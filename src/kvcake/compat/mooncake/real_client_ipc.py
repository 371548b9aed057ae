"""The dummy-client service of kvcake's ``mooncake_client``: a TCP listener on 127.0.0.1:--port
(where Mooncake's real client serves its dummy-client RPC) with one thread per attached dummy
(at most ``MAX_SESSIONS``). A connection that sends anything but well-formed frames, or stops
in the middle of one for ``KVCAKE_DUMMY_FRAME_S``, is closed (the others go on); a dummy that
disconnects or dies has its shared memory unmapped."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import struct
import threading

from kvcake.compat.mooncake import _dummy_wire as W
from kvcake.compat.mooncake.real_client_session import Outcome, Session
from kvcake.core import framing
from kvcake.core.errors import FramingError
from kvcake.store import errors as E
from kvcake.store.client import Client
from kvcake.store.rpc import detect_dead_peer

log = logging.getLogger(__name__)
SEND_TIMEOUT_S = 30  # a dummy that stops reading its replies is dropped after this
FRAME_ENV = "KVCAKE_DUMMY_FRAME_S"  # a request must arrive whole within this (default 30 s)


class DummyServer:
    def __init__(self, client: Client, port: int, host: str = "127.0.0.1"):
        self.client = client
        self._listener = socket.create_server((host, port))
        self.address = "{}:{}".format(*self._listener.getsockname()[:2])
        self._lock = threading.Lock()
        self._conns: dict[socket.socket, Session] = {}
        self._stopped = threading.Event()
        self.detached: list[tuple[int, int]] = []  # (pid, bytes unmapped), the last 64
        self._thread = threading.Thread(target=self._accept_loop, name="dummy-ipc", daemon=True)
        self._thread.start()

    @property
    def sessions(self) -> int:
        with self._lock:
            return len(self._conns)

    def stop(self) -> None:
        self._stopped.set()
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return
            with self._lock:
                full = len(self._conns) >= W.MAX_SESSIONS
                if not full:
                    self._conns[conn] = Session(self.client, "{}:{}".format(*peer[:2]))
            if full:
                _refuse(conn)
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        session = self._conns[conn]
        frame_s = float(os.environ.get(FRAME_ENV, "30"))
        try:
            _configure(conn)
            while True:
                idle = select.poll()  # (not select(): a node may hold more than 1024 fds)
                idle.register(conn, select.POLLIN)
                idle.poll()  # idle between requests: no deadline
                conn.settimeout(frame_s)  # a request started must arrive whole
                frame = framing.read_frame(conn, W.REQUESTS, W.REQUEST_LIMITS)
                if frame is None:
                    break
                _send(conn, frame.header.request_id, session.handle(frame.msg))
        except FramingError as exc:
            log.warning(
                "dummy client %s sent a bad frame (%s); connection closed", session.peer, exc
            )
        except OSError as exc:
            log.info("dummy client %s: connection lost (%s)", session.peer, exc)
        finally:
            with self._lock:
                self._conns.pop(conn, None)
            freed = session.close()
            conn.close()
            with self._lock:
                self.detached = [*self.detached[-63:], (session.pid, freed)]
            log.info(
                "dummy client pid %d detached; %d bytes of its memory unmapped", session.pid, freed
            )


def _configure(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", SEND_TIMEOUT_S, 0))
    detect_dead_peer(conn)


def _send(conn: socket.socket, rid: int, outcome: Outcome) -> None:
    reply, parts = outcome
    meta = W.REPLIES.encode(reply)
    total = sum(memoryview(p).nbytes for p in parts)
    framing.sendall_parts(conn, [framing.pack_header(rid, len(meta), total) + meta, *parts])


def _refuse(conn: socket.socket) -> None:
    """One error reply (to whatever the dummy sends first), then close: too many dummies."""
    try:
        conn.settimeout(2)
        _send(conn, 0, (W.Reply(code=E.INTERNAL_ERROR, message="too many dummy clients"), []))
    except OSError:
        pass
    finally:
        conn.close()
