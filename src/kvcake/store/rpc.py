"""Blocking client side of the master RPC: one TCP connection, one call at a time (thread-safe
by a lock). A call that times out or finds the connection broken is re-sent on a new connection
(``retries`` times): mutating requests carry a :class:`~kvcake.store.protocol.ReqId` the master
deduplicates on, so a re-sent request is applied once and gets the first outcome back.

Every reply carries its master's term (store/leadership.py); a connection remembers the
highest term seen (:class:`Terms`, shared by every connection to one ``etcd://`` pool in the
process) and drops a reply from an older one: a deposed leader that woke up and answered
before it noticed. The call then fails (``RpcFailed``) and an ``etcd://`` connection finds
the leader again."""

from __future__ import annotations

import contextlib
import itertools
import secrets
import socket
import struct
import threading
from collections.abc import Callable

import msgspec

from kvcake.core import auth as _auth
from kvcake.core import framing
from kvcake.core.errors import FramingError, TruncatedFrame
from kvcake.store import protocol as P
from kvcake.store.errors import RpcFailed, SegmentAlreadyExists, Unauthorized, error_for
from kvcake.transfer.stream import Poller

# Replies can be large (a KvSnapshot of a big pool); requests are capped by the master.
REPLY_LIMITS = framing.FrameLimits(max_meta=1 << 30, max_data=0)
DEAD_PEER_S = 3  # a master host that stopped acknowledging at the TCP level is given up after this


def detect_dead_peer(sock: socket.socket, seconds: int = DEAD_PEER_S) -> None:
    """Notice a silently vanished peer (partition, host down: no reset ever arrives) in about
    ``seconds`` instead of a whole call timeout: unacknowledged data (TCP_USER_TIMEOUT) and a
    wait for a reply (keepalive probes every second) both fail then, so an ``etcd://`` client
    moves to the new leader. A live but slow master's kernel still acknowledges: long calls
    are unaffected."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: keep the call timeout only
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, seconds)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, seconds * 1000)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise RpcFailed(f"address must be host:port, got {address!r}")
    return host, int(port)


def send_msg(
    sock: socket.socket, codec: framing.Codec[msgspec.Struct], rid: int, msg: msgspec.Struct
) -> None:
    """A data-less frame in one ``sendall`` (``framing.send_frame`` without its scatter/gather
    bookkeeping: an RPC's header and meta are a few hundred bytes)."""
    sock.sendall(encode_msg(codec, rid, msg))


def encode_msg(codec: framing.Codec[msgspec.Struct], rid: int, msg: msgspec.Struct) -> bytes:
    """A data-less frame's bytes: header and meta."""
    meta = codec.encode(msg)
    return framing.pack_header(rid, len(meta)) + meta


class BufferedFrames:
    """Reads kvcake frames from a blocking socket with one ``recv`` per frame in the common
    case (header and body arrive together), instead of one per section: on loopback each
    syscall costs tens of microseconds, which is most of a small RPC."""

    def __init__(
        self,
        sock: socket.socket,
        codec: framing.Codec[msgspec.Struct],
        limits: framing.FrameLimits = framing.DEFAULT_LIMITS,
        busy_poll_us: float = 0.0,
    ):
        self.sock = sock
        self.codec = codec
        self.limits = limits
        self.buf = bytearray()
        self._poller = Poller(busy_poll_us)

    def read(self) -> framing.Frame[msgspec.Struct] | None:
        """The next frame; ``None`` on a clean EOF between frames."""
        while len(self.buf) < framing.HEADER_SIZE:
            if not self._fill():
                if self.buf:
                    raise TruncatedFrame("stream ended inside a header")
                return None
        hdr = framing.parse_header(self.buf, self.limits)
        end = framing.HEADER_SIZE + hdr.meta_len + hdr.data_len
        while len(self.buf) < end:
            if not self._fill():
                raise TruncatedFrame("stream ended inside a frame")
        meta_end = framing.HEADER_SIZE + hdr.meta_len
        msg = self.codec.decode(memoryview(self.buf)[framing.HEADER_SIZE : meta_end])
        data = bytes(self.buf[meta_end:end])
        del self.buf[:end]
        return framing.Frame(hdr, msg, data)

    def _fill(self) -> bool:
        chunk = self._poller.recv(self.sock.recv, (1 << 16,), not self.buf)
        self.buf += chunk
        return bool(chunk)


class Terms:
    """The highest master term seen; replies of older terms are stale."""

    def __init__(self) -> None:
        self.highest = 0
        self._lock = threading.Lock()

    def accept(self, term: int) -> bool:
        """Note ``term``; False if it is older than one seen (a deposed master's reply)."""
        if term > self.highest:
            with self._lock:
                self.highest = max(self.highest, term)
        return term >= self.highest

    def reset(self, term: int) -> None:
        """etcd itself names an older leader than any seen: it was wiped and restarted; etcd
        is the authority, so its count starts again."""
        with self._lock:
            self.highest = term


class MasterConnection:
    def __init__(
        self,
        address: str,
        timeout_s: float = 30.0,
        busy_poll_us: float = 0.0,
        retries: int = 1,
        auth: _auth.Authenticator | None = None,
        terms: Terms | None = None,
    ):
        """``timeout_s``: the deadline of each try of a call (the master call timeout)."""
        self.address = address
        self.terms = terms or Terms()
        self.auth = _auth.resolve(auth)  # None: the environment's secret, if any
        self.timeout_s = timeout_s
        self.busy_poll_us = busy_poll_us
        self.retries = retries
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.session = secrets.token_hex(8)
        self._seq = 0  # last ReqId.seq sent; under _lock
        self._acked = 0  # last seq whose reply arrived

    def _connect(self) -> socket.socket:
        host, port = split_address(self.address)
        try:
            sock = socket.create_connection((host, port), timeout=min(self.timeout_s, 5.0))
        except OSError as exc:
            raise RpcFailed(f"cannot reach master at {self.address}: {exc}") from exc
        if self.auth is not None:  # once per connection
            try:
                self.auth.client_handshake(sock, _auth.MASTER, self.address)
            except (_auth.AuthError, OSError) as exc:
                sock.close()
                if isinstance(exc, _auth.AuthError):
                    raise Unauthorized(f"master {self.address}: {exc}") from exc
                raise RpcFailed(f"cannot reach master at {self.address}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        detect_dead_peer(sock)
        # Blocking socket with a kernel receive timeout: no poll() before every recv.
        sock.settimeout(None)
        _set_rcvtimeo(sock, self.timeout_s)
        self._reader = BufferedFrames(sock, P.REPLY_CODEC, REPLY_LIMITS, self.busy_poll_us)
        return sock

    def set_timeout(self, timeout_s: float) -> None:
        """A new per-try deadline (a client learns the master's client TTL after its first
        call), for the open connection too."""
        with self._lock:
            self.timeout_s = timeout_s
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    _set_rcvtimeo(self._sock, timeout_s)

    def call(
        self,
        msg: msgspec.Struct,
        retries: int | None = None,
        meanwhile: Callable[[], None] | None = None,
    ) -> P.Reply:
        """Send one request; return its reply, raising the typed error of a whole-call failure.
        ``retries`` overrides the connection's re-send count for this call. ``meanwhile``: run
        once, after the request is sent and before its reply is read (work that overlaps the
        master's; it runs under this connection's lock, so other threads' calls wait for it: keep
        it short); if it raises, the connection is closed and the exception passes through."""
        retries = self.retries if retries is None else retries
        with self._lock:
            if type(msg).__name__ in P.MUTATING and getattr(msg, "rid", None) is None:
                self._seq += 1
                msg.rid = P.ReqId(self.session, self._seq, self._acked)  # type: ignore[attr-defined]
            frame = self._exchange(msg, retries, meanwhile)
            rid = getattr(msg, "rid", None)
            if rid is not None:
                self._acked = max(self._acked, rid.seq)
            if isinstance(frame.msg, P.ErrorReply):
                self._close_locked()  # the master closes after an ErrorReply: so do we
            if not self.terms.accept(frame.msg.term):  # type: ignore[attr-defined]
                self._close_locked()
                raise RpcFailed(
                    f"master {self.address}: dropped a reply of term {frame.msg.term} "  # type: ignore[attr-defined]
                    f"(term {self.terms.highest} leads)"
                )
        return _reply_of(frame.msg)

    def _exchange(
        self, msg: msgspec.Struct, retries: int, meanwhile: Callable[[], None] | None
    ) -> framing.Frame[msgspec.Struct]:
        """Send ``msg`` and read its reply frame, on a new connection after a failure, at most
        ``retries`` times more (the lock is held)."""
        for attempt in range(retries + 1):
            if self._sock is None:
                self._sock = self._connect()
            try:
                send_msg(self._sock, P.REQUEST_CODEC, next(self._ids), msg)
                if meanwhile is not None:
                    run, meanwhile = meanwhile, None
                    try:
                        run()
                    except BaseException:
                        self._close_locked()  # its reply is on the way: out of step now
                        raise
                frame = self._reader.read()
                if frame is None:
                    raise ConnectionError("master closed the connection")
                return frame
            except _auth.AuthError as exc:  # (AuthRequired is a FramingError: first)
                self._close_locked()
                raise Unauthorized(f"master {self.address}: {exc}") from exc
            except (OSError, ConnectionError, FramingError) as exc:
                self._close_locked()
                if attempt == retries:
                    raise RpcFailed(f"master {self.address}: {exc}") from exc
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _close_locked(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def close(self) -> None:
        with self._lock:
            self._close_locked()


def _reply_of(msg: object) -> P.Reply:
    """A reply message as a Reply, or the typed error it carries."""
    if isinstance(msg, P.ErrorReply):
        raise error_for(msg.code, msg.message)
    assert isinstance(msg, P.Reply)
    if msg.code != 0:
        if msg.code == SegmentAlreadyExists.default_code and len(msg.holder) == 2:
            raise SegmentAlreadyExists(msg.message, holder=(msg.holder[0], msg.holder[1]))
        raise error_for(msg.code, msg.message)
    return msg


def _set_rcvtimeo(sock: socket.socket, timeout_s: float) -> None:
    """A kernel receive timeout on a blocking socket: no poll() before every recv."""
    secs = int(timeout_s)
    usecs = int((timeout_s - secs) * 1e6)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", secs, usecs))
