"""The per-process transfer server: peers read and write this process's segments over TCP.

Bytes of a write are ``recv_into``'d straight into segment memory (except the < 4 KB that may
arrive in the same read-ahead as their header, see :mod:`.stream`) and a read is answered with
``sendmsg`` straight from it. A refused request (unknown
segment, bad range) gets a ``Fail`` reply and its data section is drained, so the connection
stays usable; a malformed, oversized or truncated frame closes only that connection.
"""

from __future__ import annotations

import socket

from kvcake.core import framing
from kvcake.core.errors import TransferError
from kvcake.transfer.netserver import ThreadedServer
from kvcake.transfer.protocol import CODEC, Ack, Fail, Probe, ReadReq, WriteReq, request_limits
from kvcake.transfer.segments import SegmentTable
from kvcake.transfer.stream import FrameReader, FrameWriter


def _readable(conn: socket.socket) -> bool:
    """Is more input (or EOF) waiting? Then replies may be held back and batched."""
    try:
        return bool(conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return False


def _head(rid: int, msg: Ack | Fail, data_len: int = 0) -> bytes:
    meta = CODEC.encode(msg)
    return framing.pack_header(rid, len(meta), data_len) + meta


class TransferServer(ThreadedServer):
    """Serves ``segments`` on every address of ``hosts`` (one port shared when possible).

    Replies to pipelined requests are gathered and sent together once no further request is
    already buffered (one ``sendmsg`` for a run of acks or read responses)."""

    def __init__(
        self,
        segments: SegmentTable,
        hosts: tuple[str, ...],
        max_data: int,
        busy_poll_us: float = 0.0,
    ):
        super().__init__(hosts, 0, name="transfer")
        self.segments = segments
        self.busy_poll_us = busy_poll_us
        self.limits = request_limits(max_data)

    def handle(self, conn: socket.socket, listen_address: str) -> None:
        reader = FrameReader(conn, busy_poll_us=self.busy_poll_us)
        writer = FrameWriter(conn)
        while True:
            if not reader.has_frame_header() and not _readable(conn):
                writer.flush()  # about to block for input: the peer must see its replies
            hdr = reader.read_header(self.limits)
            if hdr is None:
                writer.flush()
                return
            meta = reader.read_bytes(hdr.meta_len)
            try:
                msg = CODEC.decode(meta)
            except framing.MalformedFrame:
                reader.skip(hdr.data_len)
                writer.queue(_head(hdr.request_id, Fail("MalformedFrame", "undecodable request")))
                continue
            self._one(reader, writer, hdr, msg)

    def _one(
        self, reader: FrameReader, writer: FrameWriter, hdr: framing.FrameHeader, msg: object
    ) -> None:
        rid = hdr.request_id
        if isinstance(msg, WriteReq):
            try:
                view = self.segments.resolve(msg.segment, msg.offset, hdr.data_len)
            except TransferError as exc:
                reader.skip(hdr.data_len)
                writer.queue(_head(rid, Fail(type(exc).__name__, str(exc))))
                return
            reader.read_into(view)
            writer.queue(_head(rid, Ack(hdr.data_len)))
            return
        reader.skip(hdr.data_len)  # no other request carries data
        if isinstance(msg, ReadReq):
            if msg.length > self.limits.max_data:
                writer.queue(_head(rid, Fail("OutOfRange", f"read of {msg.length} B is too large")))
                return
            try:
                view = self.segments.resolve(msg.segment, msg.offset, msg.length)
            except TransferError as exc:
                writer.queue(_head(rid, Fail(type(exc).__name__, str(exc))))
                return
            writer.queue(_head(rid, Ack(msg.length), msg.length), view)
        elif isinstance(msg, Probe):
            writer.queue(_head(rid, Ack(0)))
        else:
            writer.queue(
                _head(rid, Fail("InvalidRequest", f"{type(msg).__name__} is not a request"))
            )
