"""Vectored frames on the initiator's side: one ``WriteV``/``ReadV`` request per batch of
blocks and its ``AckV`` reply (wire format in :mod:`.protocol`).

Both the lanes of the general path (slices of jobs, retried over paths) and the inline batch
path (one frame in the caller's thread, see ``TcpTransport.run_vectors``) encode and decode
frames here, so the wire rules live in one place.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from typing_extensions import Buffer

from kvcake.core import framing
from kvcake.core.errors import MalformedFrame, TruncatedFrame
from kvcake.transfer.errors import (
    InvalidRequest,
    OutOfRange,
    RemoteError,
    StaleWrite,
    TransferError,
    UnknownSegment,
)
from kvcake.transfer.protocol import CODEC, AckV, Fail, ReadV, WriteV, request_limits
from kvcake.transfer.stream import FrameReader
from kvcake.transfer.types import Op

REMOTE_ERRORS: dict[str, type[TransferError]] = {
    "OutOfRange": OutOfRange,
    "UnknownSegment": UnknownSegment,
    "InvalidRequest": InvalidRequest,
    "StaleWrite": StaleWrite,
}
REPLY_LIMITS = request_limits(2**40)

# Per-entry refusals of one reply: entry index -> error. ``None``: every entry succeeded.
Refusals = dict[int, TransferError] | None


def remote_error(kind: str, message: str) -> TransferError:
    return REMOTE_ERRORS.get(kind, RemoteError)(f"remote: {message}")


def add_request(
    parts: list[Buffer],
    rid: int,
    op: Op,
    names: list[str],
    rows: list[int],
    data: list[memoryview],
    total: int,
    fences: list[int] | None = None,
) -> None:
    """Append one vectored request to ``parts``: header + meta (segment table ``names``,
    flattened ``(segment index, offset, length)`` ``rows``, a write's per-entry ``fences``)
    and, for a write, ``data`` (one part per entry, sent straight from initiator memory;
    ``total`` bytes)."""
    desc = struct.pack(f"<{len(rows)}q", *rows)
    if op is Op.WRITE:
        fenced = struct.pack(f"<{len(fences)}q", *fences) if fences else b""
        meta = CODEC.encode(WriteV(names, desc, fenced))
        parts.append(framing.pack_header(rid, len(meta), total) + meta)
        parts.extend(data)
    else:
        meta = CODEC.encode(ReadV(names, desc))
        parts.append(framing.pack_header(rid, len(meta), 0) + meta)


def read_reply(reader: FrameReader, rid: int) -> tuple[object, int]:
    """The reply to request ``rid``: its message and the length of the data that follows."""
    head = reader.read_head(REPLY_LIMITS)
    if head is None:
        raise TruncatedFrame("transfer server closed the connection")
    reply_rid, meta_len, data_len = head
    if reply_rid != rid:
        raise MalformedFrame(f"reply {reply_rid} does not match request {rid}")
    return reader.read_msg(CODEC, meta_len), data_len


def read_vreply(
    reader: FrameReader,
    rid: int,
    op: Op,
    views: list[memoryview],
    landed: Callable[[int, int, int], None] | None = None,
) -> TransferError | Refusals:
    """Read the reply to a vectored request of ``len(views)`` entries. A refusal of the whole
    frame is returned as one error, per-entry refusals as a dict; a read's bytes land straight
    in ``views`` (one ``recvmsg_into`` per wake-up; ``landed(k, start, end)`` is told of the
    pieces of entry ``k``, see ``FrameReader.read_into_views``). A broken stream raises."""
    msg, data_len = read_reply(reader, rid)
    if type(msg) is Fail:
        if data_len:
            raise MalformedFrame("a Fail reply carries no data")
        return remote_error(msg.kind, msg.message)
    if type(msg) is not AckV:
        raise MalformedFrame(f"unexpected reply {type(msg).__name__}")
    bad: Refusals = None
    if msg.failed:
        bad = {}
        for i, kind, message in msg.failed:
            if not 0 <= i < len(views):
                raise MalformedFrame(f"reply names entry {i} of {len(views)}")
            bad[i] = remote_error(kind, message)
    if op is Op.READ:
        keep = range(len(views)) if bad is None else [i for i in range(len(views)) if i not in bad]
        good = views if bad is None else [views[i] for i in keep]
        expect = 0
        for v in good:
            expect += v.nbytes
        if data_len != expect:
            raise MalformedFrame(f"reply of {data_len} bytes, expected {expect}")
        if landed is None:
            reader.read_into_views(good)
        else:
            reader.read_into_views(good, lambda k, a, b: landed(keep[k], a, b))
    elif data_len:
        raise MalformedFrame("a write's reply carries no data")
    return bad
