"""Pooled connections ("endpoints") to peers' transfer servers, with a cap.

Invariants (asserted by ``check``): every endpoint is either idle or busy, never both;
``idle + busy == open <= cap``. Only idle endpoints may be evicted (SIEVE picks which); when the
cap is reached and none is idle, ``acquire`` waits for a release. Sockets of a path that failed
are closed, never returned to the pool.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from kvcake.core.auth import TRANSFER, Authenticator, AuthError
from kvcake.net.netserver import split_address
from kvcake.transfer.errors import AuthFailed, EndpointsExhausted, PathFailure
from kvcake.transfer.sieve import Sieve
from kvcake.transfer.stream import FrameReader

_ids = itertools.count(1)


@dataclass(eq=False)
class Endpoint:
    address: str
    sock: socket.socket
    id: int = field(default_factory=lambda: next(_ids))
    rid: int = 0
    busy_poll_us: float = 0.0
    reader: FrameReader = field(init=False)

    def __post_init__(self) -> None:
        self.reader = FrameReader(self.sock, busy_poll_us=self.busy_poll_us)

    def next_rid(self) -> int:
        self.rid += 1
        return self.rid

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()

    def abort(self) -> None:
        """Close with a reset: what the kernel still holds to send is thrown away. A graceful
        close of a write that timed out against a paused or cut-off peer lets the kernel
        deliver the rest when the peer wakes or the link heals, after the put was revoked
        and its range perhaps given to another object."""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        with contextlib.suppress(OSError):
            self.sock.close()


_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


def set_io_timeout(sock: socket.socket, seconds: float) -> None:
    """Kernel-side send/receive timeouts on a *blocking* socket: a stalled peer fails the call
    (EAGAIN -> OSError) while each call stays one system call (Python's own socket timeouts
    make the socket non-blocking and add a poll per call, which costs latency)."""
    sec = int(seconds)
    tv = struct.pack("ll", sec, int((seconds - sec) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


class EndpointPool:
    def __init__(
        self,
        cap: int,
        connect_timeout_s: float,
        io_timeout_s: float,
        busy_poll_us: float = 0.0,
        auth: Authenticator | None = None,
    ):
        self.cap = cap
        self._auth = auth
        self._busy_poll_us = busy_poll_us
        self._connect_timeout = connect_timeout_s
        self._io_timeout = io_timeout_s
        # Fast paths take the C-level lock directly (``with self._lock``); the condition shares
        # it for the rare waits (a Condition's own __enter__ is a Python call on every use).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._waiters = 0
        self._idle: dict[str, list[Endpoint]] = {}
        self._busy: set[Endpoint] = set()
        self._sieve: Sieve[Endpoint] = Sieve()
        self.created = 0
        self.evicted = 0
        self._closed = False

    def _open_count(self) -> int:
        return len(self._sieve)

    def acquire(self, address: str) -> Endpoint:
        deadline = None
        with self._lock:
            while True:
                if self._closed:
                    raise PathFailure("endpoint pool is closed")
                idle = self._idle.get(address)
                if idle:
                    ep = idle.pop()
                    self._busy.add(ep)
                    self._sieve.touch(ep)
                    return ep
                if self._open_count() >= self.cap:
                    victim = self._sieve.evict(lambda e: e not in self._busy)
                    if victim is not None:
                        self._idle[victim.address].remove(victim)
                        victim.close()
                        self.evicted += 1
                if self._open_count() < self.cap:
                    # Reserve the slot before connecting outside the lock.
                    placeholder = Endpoint(address, socket.socket())
                    placeholder.sock.close()
                    self._sieve.insert(placeholder)
                    self._busy.add(placeholder)
                    break
                if deadline is None:
                    deadline = time.monotonic() + self._io_timeout
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EndpointsExhausted(
                        f"no free endpoint within {self._io_timeout}s (cap {self.cap})"
                    )
                self._waiters += 1
                try:
                    self._cond.wait(left)
                finally:
                    self._waiters -= 1
        return self._connect(address, placeholder)

    def _connect(self, address: str, placeholder: Endpoint) -> Endpoint:
        host, port = split_address(address)
        try:
            sock = socket.create_connection((host, port), self._connect_timeout)
        except OSError as exc:
            self._forget(placeholder)
            raise PathFailure(f"cannot connect to {address}: {exc}") from exc
        if self._auth is not None:  # once per connection, never per frame
            try:
                self._auth.client_handshake(sock, TRANSFER, address)
            except (AuthError, OSError) as exc:
                sock.close()
                self._forget(placeholder)
                if isinstance(exc, AuthError):
                    raise AuthFailed(str(exc)) from exc
                raise PathFailure(f"cannot connect to {address}: {exc}") from exc
        # create_connection's timeout leaves Python's non-blocking timeout mode on (a poll
        # before every call): go back to a blocking socket, then the kernel-side timeouts.
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        set_io_timeout(sock, self._io_timeout)
        ep = Endpoint(address, sock, busy_poll_us=self._busy_poll_us)
        with self._cond:
            self._sieve.remove(placeholder)
            self._busy.discard(placeholder)
            self._sieve.insert(ep)
            self._busy.add(ep)
            self.created += 1
        return ep

    def _forget(self, ep: Endpoint) -> None:
        with self._cond:
            if ep in self._sieve:
                self._sieve.remove(ep)
            self._busy.discard(ep)
            self._cond.notify_all()

    def release(self, ep: Endpoint, healthy: bool = True) -> None:
        """Return ``ep``; an unhealthy one (I/O error, unknown stream state) is reset
        (:meth:`Endpoint.abort`)."""
        with self._lock:
            self._busy.discard(ep)
            if healthy and not self._closed and ep in self._sieve:
                self._idle.setdefault(ep.address, []).append(ep)
            else:
                if ep in self._sieve:
                    self._sieve.remove(ep)
                if healthy:
                    ep.close()
                else:
                    ep.abort()
            if self._waiters:
                self._cond.notify_all()

    def invalidate(self, address: str) -> None:
        """Close every idle endpoint to ``address`` (its path just failed)."""
        with self._cond:
            for ep in self._idle.pop(address, []):
                self._sieve.remove(ep)
                ep.close()
            self._cond.notify_all()

    def stats(self) -> dict[str, int]:
        with self._cond:
            idle = sum(len(v) for v in self._idle.values())
            return {
                "open": self._open_count(),
                "idle": idle,
                "busy": len(self._busy),
                "cap": self.cap,
                "created": self.created,
                "evicted": self.evicted,
            }

    def check(self) -> None:
        """Assert the accounting invariants (used by tests)."""
        s = self.stats()
        assert s["idle"] + s["busy"] == s["open"] <= s["cap"], s

    def close(self) -> None:
        with self._cond:
            self._closed = True
            eps = [e for v in self._idle.values() for e in v]
            self._idle.clear()
            for ep in eps:
                self._sieve.remove(ep)
            self._cond.notify_all()
        for ep in eps:
            ep.close()
