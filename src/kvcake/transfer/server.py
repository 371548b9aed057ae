"""The per-process transfer server: peers read and write this process's segments over TCP.

Bytes of a write are ``recv_into``'d straight into segment memory and a read is answered with
``sendmsg`` straight from it: no intermediate buffer on either path. A refused request (unknown
segment, bad range) gets a ``Fail`` reply and its data section is drained, so the connection
stays usable; a malformed, oversized or truncated frame closes only that connection.
"""

from __future__ import annotations

import logging
import socket

from kvcake.core import framing
from kvcake.core.errors import TransferError
from kvcake.transfer.netserver import ThreadedServer
from kvcake.transfer.protocol import CODEC, Ack, Fail, Probe, ReadReq, WriteReq, request_limits
from kvcake.transfer.segments import SegmentTable

log = logging.getLogger(__name__)

_DRAIN_CHUNK = 256 * 1024


def _drain(conn: socket.socket, n: int) -> None:
    """Discard ``n`` bytes of a refused write's data section."""
    scratch = memoryview(bytearray(min(n, _DRAIN_CHUNK)))
    while n > 0:
        chunk = scratch[: min(n, scratch.nbytes)]
        framing.recv_exact_into(conn, chunk)
        n -= chunk.nbytes


def _send(conn: socket.socket, rid: int, msg: Ack | Fail, data: memoryview | None = None) -> None:
    meta = CODEC.encode(msg)
    n = data.nbytes if data is not None else 0
    head = framing.pack_header(rid, len(meta), n) + meta
    if data is None:
        conn.sendall(head)
    else:
        framing.sendall_parts(conn, [head, data])


class TransferServer(ThreadedServer):
    """Serves ``segments`` on every address of ``hosts`` (one port shared when possible)."""

    def __init__(self, segments: SegmentTable, hosts: tuple[str, ...], max_data: int):
        super().__init__(hosts, 0, name="transfer")
        self.segments = segments
        self.limits = request_limits(max_data)
        self.served_bytes = 0

    def handle(self, conn: socket.socket, listen_address: str) -> None:
        while True:
            hdr = framing.read_header(conn, self.limits)
            if hdr is None:
                return
            meta = bytearray(hdr.meta_len)
            framing.recv_exact_into(conn, memoryview(meta))
            try:
                msg = CODEC.decode(meta)
            except framing.MalformedFrame:
                _drain(conn, hdr.data_len)
                _send(conn, hdr.request_id, Fail("MalformedFrame", "undecodable request"))
                continue
            self._one(conn, hdr, msg)

    def _one(self, conn: socket.socket, hdr: framing.FrameHeader, msg: object) -> None:
        rid = hdr.request_id
        if isinstance(msg, WriteReq):
            try:
                view = self.segments.resolve(msg.segment, msg.offset, hdr.data_len)
            except TransferError as exc:
                _drain(conn, hdr.data_len)
                _send(conn, rid, Fail(type(exc).__name__, str(exc)))
                return
            framing.recv_exact_into(conn, view)
            self.served_bytes += hdr.data_len
            _send(conn, rid, Ack(hdr.data_len))
            return
        _drain(conn, hdr.data_len)  # no other request carries data
        if isinstance(msg, ReadReq):
            if msg.length > self.limits.max_data:
                _send(conn, rid, Fail("OutOfRange", f"read of {msg.length} bytes is too large"))
                return
            try:
                view = self.segments.resolve(msg.segment, msg.offset, msg.length)
            except TransferError as exc:
                _send(conn, rid, Fail(type(exc).__name__, str(exc)))
                return
            _send(conn, rid, Ack(msg.length), view)
            self.served_bytes += msg.length
        elif isinstance(msg, Probe):
            _send(conn, rid, Ack(0))
        else:
            _send(conn, rid, Fail("InvalidRequest", f"{type(msg).__name__} is not a request"))
