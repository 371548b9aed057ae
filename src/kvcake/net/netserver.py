"""A small blocking-socket server: accept threads per listen address, one thread per connection.

Blocking sockets with a thread per connection keep the data path simple (``recv_into`` straight
into segment memory, ``sendmsg`` straight out of it) and the GIL is released during every
socket call. Subclasses implement :meth:`handle` for one connection; any exception it raises
closes that connection only, the server keeps serving.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from abc import ABC, abstractmethod

from kvcake.core import auth as _auth

log = logging.getLogger(__name__)
MAX_HANDSHAKES = 128  # unauthenticated connections at once, per server
MAX_CONNECTIONS = 1024  # open connections (one thread each) at once, per server


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address must be 'host:port', got {address!r}")
    return host, int(port)


class ThreadedServer(ABC):
    """Owns its listening sockets, accept threads and connection threads; ``stop`` closes and
    joins all of them (idempotent)."""

    def __init__(
        self,
        hosts: tuple[str, ...],
        port: int = 0,
        name: str = "server",
        auth: _auth.Authenticator | None = None,
    ):
        """``auth``: every connection must pass its HMAC challenge (``name`` is the context)
        before :meth:`handle` sees a byte; None = no secret, loopback hosts only."""
        if not hosts:
            raise ValueError("at least one listen host is needed")
        self._hosts = hosts
        self._port = port
        self._name = name
        self.auth = auth
        self.auth_refused = 0
        self.auth_passed = 0  # handshakes: one per connection, never per frame
        self.conns_refused = 0  # connections closed at once: max_conn_threads were open
        # A hard bound on connection threads; a subclass with its own (friendlier, answered)
        # limit sets this a little above it, so its refusal gets a thread to run in.
        self.max_conn_threads = MAX_CONNECTIONS
        self._handshaking = 0  # connections not yet authenticated (bounded: MAX_HANDSHAKES)
        self._lock = threading.Lock()
        self._listeners: dict[str, socket.socket] = {}
        self._conns: dict[socket.socket, str] = {}
        self._threads: list[threading.Thread] = []
        self._conn_threads: list[threading.Thread] = []
        self._stopped = threading.Event()
        self.addresses: list[str] = []

    def start(self) -> None:
        for host in self._hosts:
            _auth.check_bind(host, self.auth, f"the {self._name} server")
        port = self._port
        for host in self._hosts:
            addr = self._listen(host, port)
            self.addresses.append(addr)
            # With port 0 the first bind picks a port; later addresses reuse it when free so a
            # host's "NICs" share a port (easier to read), else they get their own.
            if self._port == 0 and port == 0:
                port = split_address(addr)[1]

    def _listen(self, host: str, port: int) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            if port == 0 or self._port != 0:
                sock.close()
                raise
            sock.bind((host, 0))
        sock.listen(128)
        addr = f"{host}:{sock.getsockname()[1]}"
        with self._lock:
            self._listeners[addr] = sock
        t = threading.Thread(target=self._accept_loop, args=(sock, addr), daemon=True)
        t.name = f"{self._name}-accept-{addr}"
        t.start()
        self._threads.append(t)
        return addr

    def _accept_loop(self, lsock: socket.socket, addr: str) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = lsock.accept()
            except OSError:
                return  # listener closed
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                # A connection accepted just before close_address took the listener away would
                # escape its sweep and keep a "dead NIC" serving: drop it here instead.
                if self._stopped.is_set() or self._listeners.get(addr) is not lsock:
                    conn.close()
                    return
                full = len(self._conns) >= self.max_conn_threads
                if full:
                    self.conns_refused += 1
                else:
                    self._conns[conn] = addr
            if full:
                # A thread per connection: past the bound a peer (or a flood) gets a closed
                # socket, and its client's retry finds a slot once others close.
                log.warning("%s: %d connections open on %s, refusing one",
                            self._name, self.max_conn_threads, addr)  # fmt: skip
                conn.close()
                continue
            t = threading.Thread(target=self._serve, args=(conn, addr), daemon=True)
            t.name = f"{self._name}-conn"
            t.start()
            with self._lock:
                self._conn_threads = [x for x in self._conn_threads if x.is_alive()] + [t]

    def _serve(self, conn: socket.socket, addr: str) -> None:
        try:
            if self.auth is not None and not self._authenticate(conn, addr):
                return
            self.handle(conn, addr)
        except Exception as exc:  # one bad peer must never take the server down
            if not self._stopped.is_set():
                log.debug("%s: connection on %s closed: %r", self._name, addr, exc)
        finally:
            with self._lock:
                self._conns.pop(conn, None)
            with contextlib.suppress(OSError):
                conn.close()

    def _authenticate(self, conn: socket.socket, addr: str) -> bool:
        """The HMAC challenge; at most MAX_HANDSHAKES at once, so peers that connect and never
        answer (each holding a thread for up to the handshake timeout) cannot pile up."""
        assert self.auth is not None
        with self._lock:
            busy = self._handshaking >= MAX_HANDSHAKES
            if not busy:
                self._handshaking += 1
        if busy:
            self.auth_refused += 1
            log.warning("%s: %d handshakes in progress, connection on %s dropped",
                        self._name, MAX_HANDSHAKES, addr)  # fmt: skip
            return False
        try:
            self.auth.server_handshake(conn, self._name)
        except (_auth.AuthError, OSError) as exc:
            self.auth_refused += 1
            log.info("%s: connection on %s refused: %s", self._name, addr, exc)
            return False
        finally:
            with self._lock:
                self._handshaking -= 1
        self.auth_passed += 1
        return True

    @abstractmethod
    def handle(self, conn: socket.socket, listen_address: str) -> None:
        """Serve one connection until EOF; raise to drop it."""

    def close_address(self, addr: str) -> None:
        """Stop listening on ``addr`` and cut every connection accepted there (a dead "NIC")."""
        with self._lock:
            lsock = self._listeners.pop(addr, None)
            conns = [c for c, a in self._conns.items() if a == addr]
        for s in ([lsock] if lsock else []) + conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def cut_connections(self, timeout_s: float = 2.0) -> int:
        """Cut every connection accepted so far (listeners stay) and wait up to ``timeout_s``
        for their handlers to end; returns how many were cut. After it returns, nothing that
        arrives on those connections is served -- e.g. a write sent before a partition and
        delivered by TCP's retransmission after it (store/liveness.py: a storage node the
        master forgot cuts its transfer connections before it mounts again)."""
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not any(c in self._conns for c in conns):
                    break
            time.sleep(0.002)
        else:
            log.warning("%s: a cut connection's handler has not ended after %.1f s",
                        self._name, timeout_s)  # fmt: skip
        if conns:
            log.warning("%s: cut %d connections", self._name, len(conns))
        return len(conns)

    def reopen_address(self, addr: str) -> None:
        """Listen on ``addr`` again (same host and port) after :meth:`close_address`."""
        host, port = split_address(addr)
        self._listen(host, port)

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        for addr in list(self._listeners):
            self.close_address(addr)
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        with self._lock:
            threads = self._threads + self._conn_threads
        for t in threads:
            t.join(timeout=2.0)
