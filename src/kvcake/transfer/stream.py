"""Buffered frame I/O over a blocking socket, tuned for many small frames.

:class:`FrameReader` reads ahead at most ``readahead`` bytes per ``recv`` so that a run of
pipelined small frames (headers, metas, acks) costs one system call instead of three per frame;
a data section is delivered with :meth:`FrameReader.read_into`: whatever part of it was already
read ahead (< ``readahead`` bytes) is copied, the rest is ``recv_into``'d straight into the
destination (segment memory). :class:`FrameWriter` gathers small replies and sends them with
one ``sendmsg`` (data sections by reference, never copied).
"""

from __future__ import annotations

import functools
import os
import socket
import time
from collections.abc import Callable
from typing import TypeVar

import msgspec
from typing_extensions import Buffer

from kvcake.core import framing
from kvcake.core.errors import TruncatedFrame
from kvcake.core.iochunks import IO_CALL_BYTES, IOV_CHUNK, io_groups, nbytes

READAHEAD = 8192 + 256  # a reply or request with an 8 KB block arrives in one recv
_HEADER = framing.HEADER
_HSIZE = framing.HEADER_SIZE
T = TypeVar("T")
M = TypeVar("M", bound=msgspec.Struct)


def send_all(sock: socket.socket, parts: list[Buffer]) -> None:
    """``sendmsg`` every byte of ``parts`` (bytes or 1-D byte memoryviews, never copied), at
    most ``IO_CALL_BYTES`` per call (:mod:`kvcake.core.iochunks`). The common case — a frame
    that one call carries and the socket buffer takes — costs one call and no slicing."""
    total = nbytes(parts)
    if total > IO_CALL_BYTES or len(parts) > IOV_CHUNK:
        framing.sendall_parts(sock, parts)
        return
    sent = sock.sendmsg(parts)
    if sent == total:
        return
    rest: list[Buffer] = []
    for p in parts:
        n = len(p)  # type: ignore[arg-type]
        if sent >= n:
            sent -= n
            continue
        rest.append(memoryview(p)[sent:] if sent else p)
        sent = 0
    framing.sendall_parts(sock, rest)


def recv_exact_views(sock: socket.socket, views: list[memoryview]) -> None:
    """Fill every view completely, in order, with as few ``recvmsg_into`` calls as the data's
    arrival allows, each of at most ``IO_CALL_BYTES`` and ``IOV_CHUNK`` iovecs; EOF midway
    raises TruncatedFrame."""
    if len(views) <= IOV_CHUNK and nbytes(views) <= IO_CALL_BYTES:
        _recv_group(sock, list(views))
        return
    for group in io_groups(views):
        _recv_group(sock, group)


def _recv_group(sock: socket.socket, views: list[memoryview]) -> None:
    """Fill ``views`` (one call's worth; partly filled views are replaced by their rest)."""
    j = 0
    n_views = len(views)
    while j < n_views:
        chunk = views[j:] if j else views
        got = sock.recvmsg_into(chunk)[0]
        if got == 0:
            raise TruncatedFrame("peer closed inside a vectored data section")
        for v in chunk:
            n = v.nbytes
            if got >= n:
                got -= n
                j += 1
                continue
            if got:  # a partly filled view: continue it next call
                views[j] = v[got:]
            break


def recv_landed(
    sock: socket.socket, dest: memoryview, got: int, landed: Callable[[int, int], None]
) -> None:
    """Fill ``dest`` from byte ``got`` on, telling ``landed(start, end)`` of every piece."""
    total = dest.nbytes
    while got < total:
        n = sock.recv_into(dest[got:], min(total - got, IO_CALL_BYTES))
        if n == 0:
            raise TruncatedFrame(f"peer closed after {got} of {total} bytes")
        landed(got, got + n)
        got += n


def recv_polling(recv: Callable[..., T], args: tuple[object, ...], spin_ns: int) -> T:
    """``recv(*args, flags)`` on a blocking socket: first without blocking (``MSG_DONTWAIT``),
    again and again for up to ``spin_ns``, then blocking. See ``TransferConfig.busy_poll_us``.
    (Arguments are passed through, not bound in a closure: this runs on every request.)"""
    if spin_ns:
        deadline = time.perf_counter_ns() + spin_ns
        while True:
            try:
                return recv(*args, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if time.perf_counter_ns() >= deadline:
                    break
    return recv(*args, 0)


PREEMPTED_NS = 200_000  # a spin iteration this long means another task had our CPU
CONTENDED_NS = 500_000_000  # after that, spin only the base window for this long
ADAPTIVE_CAP = 10  # an adaptive window grows to at most this many base windows


class AdaptivePoll:
    """A server connection's polling window, sized to the gaps its client leaves between
    requests. A client running a loop of store operations comes back after the *other* hop of
    each operation (a 1 MB copy, a transfer-server round trip: 60-200 µs), longer than the base
    window, so a fixed window is spent in vain and every request pays a cold wake-up. Here the
    window is ``1.5 x`` the longest of the last few gaps plus 20 µs, between ``base`` and
    ``ADAPTIVE_CAP x base``; gaps above the cap (an idle client) and spins cut short by
    preemption (a busy machine, where spinning only steals CPU from the peer) drop it back to
    the base window. ``base_us == 0`` never polls."""

    def __init__(self, base_us: float, history: int = 4):
        self.base_ns = int(base_us * 1000)
        self.cap_ns = self.base_ns * ADAPTIVE_CAP
        self.spin_ns = self.base_ns
        self._gaps = [0] * history
        self._i = 0
        self._contended_until = 0

    def observe(self, gap_ns: int, now_ns: int, preempted: bool) -> None:
        if preempted:
            self._contended_until = now_ns + CONTENDED_NS
        self._gaps[self._i] = gap_ns
        self._i = (self._i + 1) % len(self._gaps)
        longest = max(self._gaps)
        if now_ns < self._contended_until or longest > self.cap_ns:
            self.spin_ns = self.base_ns
        else:
            self.spin_ns = max(self.base_ns, min(self.cap_ns, longest * 3 // 2 + 20_000))


def recv_adaptive(recv: Callable[..., T], args: tuple[object, ...], poll: AdaptivePoll) -> T:
    """:func:`recv_polling` with the window of ``poll``, which learns from the wait."""
    spin_ns = poll.spin_ns
    t0 = last = time.perf_counter_ns()
    preempted = False
    if spin_ns:
        deadline = t0 + spin_ns
        while True:
            try:
                out = recv(*args, socket.MSG_DONTWAIT)
            except BlockingIOError:
                now = time.perf_counter_ns()
                if now - last > PREEMPTED_NS:
                    preempted = True
                    break
                if now >= deadline:
                    break
                last = now
                os.sched_yield()  # a runnable peer on this CPU (the client?) goes first
            else:
                now = time.perf_counter_ns()
                poll.observe(now - t0, now, preempted)
                return out
    out = recv(*args, 0)
    now = time.perf_counter_ns()
    poll.observe(now - t0, now, preempted)
    return out


class Poller:
    """How a reader waits for input: for a *new* frame with a window that adapts to the peer's
    gaps (:class:`AdaptivePoll`), for the rest of a frame with the fixed base window; ``0``
    never polls."""

    def __init__(self, busy_poll_us: float):
        self.base_ns = int(busy_poll_us * 1000)
        self.adaptive = AdaptivePoll(busy_poll_us) if busy_poll_us else None

    def recv(self, recv: Callable[..., T], args: tuple[object, ...], new_frame: bool) -> T:
        """``recv(*args, flags)``, waiting as described above."""
        if new_frame and self.adaptive is not None:
            return recv_adaptive(recv, args, self.adaptive)
        return recv_polling(recv, args, self.base_ns)


class FrameReader:
    """``busy_poll_us``: see ``TransferConfig.busy_poll_us`` (the socket must be blocking)."""

    def __init__(
        self,
        sock: socket.socket,
        readahead: int = READAHEAD,
        busy_poll_us: float = 0.0,
    ):
        self.sock = sock
        self._poller = Poller(busy_poll_us)
        self._buf = bytearray(readahead)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0

    @property
    def buffered(self) -> int:
        return self._end - self._start

    def _fill(self, need: int) -> bool:
        """Make ``need`` bytes available (``need`` <= readahead); False on EOF."""
        if self._end - self._start >= need:
            return True
        if self._start:
            n = self._end - self._start
            self._buf[:n] = self._view[self._start : self._end]
            self._start, self._end = 0, n
        while self._end < need:
            got = self._poller.recv(
                self.sock.recv_into, (self._view[self._end :], 0), not self._end
            )
            if got == 0:
                return False
            self._end += got
        return True

    def read_header(self, limits: framing.FrameLimits) -> framing.FrameHeader | None:
        """The next header; ``None`` on a clean EOF between frames."""
        head = self.read_head(limits)
        if head is None:
            return None
        return framing.FrameHeader(0, *head)

    def read_head(self, limits: framing.FrameLimits) -> tuple[int, int, int] | None:
        """The next header as ``(request_id, meta_len, data_len)`` (no header object: this is
        every request's and every reply's path); ``None`` on a clean EOF between frames."""
        if self._end - self._start < _HSIZE and not self._fill(_HSIZE):
            if self._end == self._start:
                return None
            raise TruncatedFrame(f"stream ended inside a header ({self.buffered} bytes)")
        start = self._start
        magic, version, _flags, rid, meta_len, data_len = _HEADER.unpack_from(self._buf, start)
        if (
            magic != framing.MAGIC
            or version != framing.VERSION
            or meta_len > limits.max_meta
            or data_len > limits.max_data
        ):  # let the one parser word the error
            framing.parse_header(self._view[start : start + _HSIZE], limits)
        self._start = start + _HSIZE
        return rid, meta_len, data_len

    def read_msg(self, codec: framing.Codec[M], n: int) -> M:
        """Decode the next ``n`` bytes (a meta section) with ``codec``, without copying them
        out of the read-ahead buffer when they fit."""
        if n > len(self._buf):
            return codec.decode(self.read_bytes(n))
        if self._end - self._start < n and not self._fill(n):
            raise TruncatedFrame(f"stream ended inside a {n}-byte section")
        start = self._start
        self._start = start + n
        return codec.decode(self._view[start : start + n])

    def read_bytes(self, n: int) -> bytes:
        if n <= len(self._buf):
            if not self._fill(n):
                raise TruncatedFrame(f"stream ended inside a {n}-byte section")
            out = bytes(self._view[self._start : self._start + n])
            self._start += n
            return out
        out_buf = bytearray(n)
        self.read_into(memoryview(out_buf))
        return bytes(out_buf)

    def read_into(self, dest: memoryview, landed: Callable[[int, int], None] | None = None) -> None:
        """Fill ``dest`` exactly: read-ahead bytes first, then straight from the socket.
        ``landed(start, end)`` is told of each piece as it arrives (``transfer.types.Landed``)."""
        take = min(self._end - self._start, dest.nbytes)
        if take:
            dest[:take] = self._view[self._start : self._start + take]
            self._start += take
            if landed is not None:
                landed(0, take)
        if take < dest.nbytes:
            if landed is None:
                framing.recv_exact_into(self.sock, dest[take:])
            else:
                recv_landed(self.sock, dest, take, landed)

    def read_into_views(
        self, views: list[memoryview], landed: Callable[[int, int, int], None] | None = None
    ) -> None:
        """Fill every view of ``views`` in order, exactly: read-ahead bytes first, then one
        ``recvmsg_into`` per wake-up with an iovec per remaining view (a batch of blocks costs
        one system call, not one per block). ``landed(k, start, end)``: view ``k``'s bytes
        ``[start, end)`` just arrived; then each view is received on its own, piece by piece,
        so its reader can hash what arrived while the next piece is on its way."""
        if landed is not None:
            for k, view in enumerate(views):
                self.read_into(view, functools.partial(landed, k))
            return
        rest = views
        if self.buffered:
            rest = []
            for k, v in enumerate(views):
                take = min(self.buffered, v.nbytes)
                if take:
                    v[:take] = self._view[self._start : self._start + take]
                    self._start += take
                if take < v.nbytes:
                    rest = [v[take:], *views[k + 1 :]]
                    break
        if rest:
            recv_exact_views(self.sock, rest)

    def take(self, n: int) -> memoryview:
        """Up to ``n`` read-ahead bytes, consumed (valid until the next read)."""
        k = min(n, self._end - self._start)
        start = self._start
        self._start = start + k
        return self._view[start : start + k]

    def skip(self, n: int) -> None:
        """Discard ``n`` bytes (the data section of a refused request)."""
        scratch = memoryview(bytearray(min(n, 256 * 1024))) if n > self.buffered else None
        while n > 0:
            if self.buffered:
                k = min(n, self.buffered)
                self._start += k
                n -= k
            elif scratch is not None:
                chunk = scratch[: min(n, scratch.nbytes)]
                framing.recv_exact_into(self.sock, chunk)
                n -= chunk.nbytes

    def has_frame_header(self) -> bool:
        """Is another header already read ahead (so replies may wait to be batched)?"""
        return self._end - self._start >= _HSIZE


class FrameWriter:
    def __init__(self, sock: socket.socket, flush_bytes: int = 1 << 20):
        self.sock = sock
        self._parts: list[memoryview | bytes] = []
        self._bytes = 0
        self._flush_bytes = flush_bytes

    def queue(self, head: bytes, data: memoryview | None = None) -> None:
        self._parts.append(head)
        self._bytes += len(head)
        if data is not None and data.nbytes:
            self._parts.append(data)
            self._bytes += data.nbytes
        if self._bytes >= self._flush_bytes or len(self._parts) >= 512:
            self.flush()

    def queue_parts(self, head: bytes, data: list[memoryview]) -> None:
        """A reply whose data section is several views (sent by reference, in order)."""
        self._parts.append(head)
        self._parts.extend(data)
        self._bytes += len(head) + sum(v.nbytes for v in data)
        if self._bytes >= self._flush_bytes or len(self._parts) >= 512:
            self.flush()

    def flush(self) -> None:
        if self._parts:
            parts, self._parts, self._bytes = self._parts, [], 0
            send_all(self.sock, parts)  # type: ignore[arg-type]
