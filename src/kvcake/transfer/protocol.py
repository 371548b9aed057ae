"""Wire messages of the transfer server (``core.framing`` frames).

    WriteReq{segment, offset}          + data section (the bytes; length = data_len)
        -> Ack{length}                  (after the bytes are in segment memory)
    ReadReq{segment, offset, length}
        -> Ack{length}                  + data section (straight from segment memory)
    Probe{}  -> Ack{length=0}           (path liveness check)
    any      -> Fail{kind, message}     (request refused; the connection stays usable)

The reply's ``request_id`` echoes the request's, so a pipelining client can match them. A
malformed or oversized frame closes the connection (the stream cannot be resynchronised).
"""

from __future__ import annotations

import msgspec

from kvcake.core import framing


class WriteReq(msgspec.Struct, tag=True, array_like=True):
    segment: str
    offset: int


class ReadReq(msgspec.Struct, tag=True, array_like=True):
    segment: str
    offset: int
    length: int


class Probe(msgspec.Struct, tag=True, array_like=True):
    pass


class Ack(msgspec.Struct, tag=True, array_like=True):
    length: int


class Fail(msgspec.Struct, tag=True, array_like=True):
    kind: str
    message: str


CODEC: framing.Codec[msgspec.Struct] = framing.Codec(WriteReq, ReadReq, Probe, Ack, Fail)


def request_limits(max_data: int) -> framing.FrameLimits:
    return framing.FrameLimits(max_meta=64 * 1024, max_data=max_data)
