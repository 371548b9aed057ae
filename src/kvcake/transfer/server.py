"""The per-process transfer server: peers read and write this process's segments over TCP.

Bytes of a write are ``recv_into``'d straight into segment memory (except the < 8 KB that may
arrive in the same read-ahead as their header, see :mod:`.stream`) and a read is answered with
``sendmsg`` straight from it. A refused request (unknown
segment, bad range) gets a ``Fail`` reply and its data section is drained, so the connection
stays usable; a malformed, oversized or truncated frame closes only that connection.
"""

from __future__ import annotations

import socket

from kvcake.core import framing
from kvcake.core.auth import Authenticator
from kvcake.core.errors import MalformedFrame, TransferError
from kvcake.net.netserver import ThreadedServer
from kvcake.transfer.errors import InvalidRequest
from kvcake.transfer.fences import FenceBook
from kvcake.transfer.protocol import (
    CODEC,
    MAX_ENTRIES,
    Ack,
    AckV,
    Fail,
    Probe,
    ReadReq,
    ReadV,
    WriteReq,
    WriteV,
    decode_desc,
    decode_fences,
    request_limits,
)
from kvcake.transfer.segments import SegmentTable, check_range
from kvcake.transfer.stream import FrameReader, FrameWriter


def _head(rid: int, msg: Ack | AckV | Fail, data_len: int = 0) -> bytes:
    meta = CODEC.encode(msg)
    return framing.pack_header(rid, len(meta), data_len) + meta


class TransferServer(ThreadedServer):
    """Serves ``segments`` on every address of ``hosts`` (one port shared when possible).

    Replies to pipelined requests are gathered and sent together while further requests are
    already read ahead (one ``sendmsg`` for a run of acks or read responses)."""

    def __init__(
        self,
        segments: SegmentTable,
        hosts: tuple[str, ...],
        max_data: int,
        busy_poll_us: float = 0.0,
        auth: Authenticator | None = None,
        port: int = 0,
        fences: FenceBook | None = None,
    ):
        super().__init__(hosts, port, name="transfer", auth=auth)
        self.segments = segments
        self.fences = fences if fences is not None else FenceBook()
        self.busy_poll_us = busy_poll_us
        self.limits = request_limits(max_data)

    def handle(self, conn: socket.socket, listen_address: str) -> None:
        reader = FrameReader(conn, busy_poll_us=self.busy_poll_us)
        writer = FrameWriter(conn)
        limits = self.limits
        while True:
            if not reader.has_frame_header():
                # About to wait for input: the peer must see its replies. (A batch is one
                # vectored frame, so holding replies back for more pipelined requests, which
                # took a MSG_PEEK system call per request, no longer pays.)
                writer.flush()
            head = reader.read_head(limits)
            if head is None:
                writer.flush()
                return
            rid, meta_len, data_len = head
            try:
                msg = reader.read_msg(CODEC, meta_len)
            except MalformedFrame:
                reader.skip(data_len)
                writer.queue(_head(rid, Fail("MalformedFrame", "undecodable request")))
                continue
            self._one(reader, writer, rid, data_len, msg)

    def _one(
        self, reader: FrameReader, writer: FrameWriter, rid: int, data_len: int, msg: object
    ) -> None:
        if type(msg) is ReadReq:  # (the 4 KB latency path: no call it does not need)
            if data_len:
                reader.skip(data_len)  # a read carries no data
            if msg.length > self.limits.max_data:
                writer.queue(_head(rid, Fail("OutOfRange", f"read of {msg.length} B is too large")))
                return
            try:
                view = self.segments.resolve(msg.segment, msg.offset, msg.length)
            except TransferError as exc:
                writer.queue(_head(rid, Fail(type(exc).__name__, str(exc))))
                return
            writer.queue(_head(rid, Ack(msg.length), msg.length), view)
        elif isinstance(msg, WriteV):
            self._write_v(reader, writer, rid, data_len, msg)
        elif isinstance(msg, ReadV):
            reader.skip(data_len)
            self._read_v(writer, rid, msg)
        elif isinstance(msg, WriteReq):
            try:
                view = self.segments.resolve(msg.segment, msg.offset, data_len)
                self.fences.check(msg.segment, msg.offset, data_len, msg.fence)
            except TransferError as exc:
                reader.skip(data_len)
                writer.queue(_head(rid, Fail(type(exc).__name__, str(exc))))
                return
            reader.read_into(view)
            writer.queue(_head(rid, Ack(data_len)))
        elif isinstance(msg, Probe):
            reader.skip(data_len)
            writer.queue(_head(rid, Ack(0)))
        else:
            reader.skip(data_len)
            writer.queue(
                _head(rid, Fail("InvalidRequest", f"{type(msg).__name__} is not a request"))
            )

    def _entries(self, msg: WriteV | ReadV) -> list[list[int]]:
        """The (segment index, offset, length) rows of a vectored request; TransferError
        when the table itself is unusable (then the whole frame is refused)."""
        try:
            rows: list[list[int]] = decode_desc(msg.desc).tolist()
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from exc
        if not rows or len(rows) > MAX_ENTRIES:
            raise InvalidRequest(
                f"a vectored request has 1..{MAX_ENTRIES} entries, not {len(rows)}"
            )
        return rows

    def _views(
        self, msg: WriteV | ReadV, rows: list[list[int]]
    ) -> list[memoryview | TransferError]:
        """Each row's view of segment memory, or the typed error that refuses it alone. Each
        segment of the request's table is looked up once."""
        segs: list[memoryview | TransferError] = []
        for name in msg.segments:
            try:
                segs.append(self.segments.get(name).view)
            except TransferError as exc:
                segs.append(exc)
        out: list[memoryview | TransferError] = []
        for index, offset, length in rows:
            if not 0 <= index < len(segs):
                out.append(InvalidRequest(f"segment index {index} not in the request's table"))
                continue
            seg = segs[index]
            if not isinstance(seg, memoryview):
                out.append(seg)
            elif length > 0 and offset >= 0 and offset + length <= seg.nbytes:
                out.append(seg[offset : offset + length])
            else:
                try:
                    check_range(msg.segments[index], seg.nbytes, offset, length)
                except TransferError as exc:  # (always: the range is out of bounds)
                    out.append(exc)
        return out

    def _write_v(
        self, reader: FrameReader, writer: FrameWriter, rid: int, data_len: int, msg: WriteV
    ) -> None:
        """Every entry's bytes straight into segment memory (one ``recvmsg_into`` per run of
        good entries); a refused entry's bytes are drained, the others still land."""
        try:
            rows = self._entries(msg)
            if sum(max(r[2], 0) for r in rows) != data_len:
                raise InvalidRequest("entry lengths do not add up to the data section")
            fences = decode_fences(msg.fences, len(rows))
        except (TransferError, ValueError) as exc:
            reader.skip(data_len)
            err = exc if isinstance(exc, TransferError) else InvalidRequest(str(exc))
            writer.queue(_head(rid, Fail(type(err).__name__, str(err))))
            return
        failed: list[tuple[int, str, str]] = []
        run: list[memoryview] = []
        for i, v in enumerate(self._views(msg, rows)):
            if isinstance(v, memoryview) and fences[i]:
                try:
                    self.fences.check(msg.segments[rows[i][0]], rows[i][1], v.nbytes, fences[i])
                except TransferError as exc:
                    v = exc
            if isinstance(v, memoryview):
                run.append(v)
                continue
            failed.append((i, type(v).__name__, str(v)))
            if run:
                reader.read_into_views(run)
                run = []
            reader.skip(max(rows[i][2], 0))
        if run:
            reader.read_into_views(run)
        writer.queue(_head(rid, AckV(failed)))

    def _read_v(self, writer: FrameWriter, rid: int, msg: ReadV) -> None:
        """One reply: the AckV (naming refused entries), then the good entries' bytes sent
        straight from segment memory."""
        try:
            rows = self._entries(msg)
        except TransferError as exc:
            writer.queue(_head(rid, Fail(type(exc).__name__, str(exc))))
            return
        failed: list[tuple[int, str, str]] = []
        views: list[memoryview] = []
        total = 0
        for i, v in enumerate(self._views(msg, rows)):
            if not isinstance(v, memoryview):
                failed.append((i, type(v).__name__, str(v)))
                continue
            views.append(v)
            total += v.nbytes
        if total > self.limits.max_data:
            writer.queue(_head(rid, Fail("OutOfRange", f"read of {total} B is too large")))
            return
        writer.queue_parts(_head(rid, AckV(failed), total), views)
