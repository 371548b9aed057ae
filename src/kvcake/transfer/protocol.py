"""Wire messages of the transfer server (``core.framing`` frames).

    WriteReq{segment, offset, fence}   + data section (the bytes; length = data_len)
        -> Ack{length}                  (after the bytes are in segment memory)
    ReadReq{segment, offset, length}
        -> Ack{length}                  + data section (straight from segment memory)
    Probe{}  -> Ack{length=0}           (path liveness check)
    WriteV{segments, desc, fences}     + data section (every entry's bytes, in entry order)
        -> AckV{failed}                 (after the bytes are in segment memory)
    ReadV{segments, desc}
        -> AckV{failed}                 + data section (the bytes of every entry that did not fail)
    any      -> Fail{kind, message}     (request refused; the connection stays usable)

``WriteV``/``ReadV`` carry a whole batch of blocks in one frame: ``desc`` is a little-endian
``int64`` array of ``(segment index, offset, length)`` rows (decoded through one numpy view),
``segments`` the names the indices refer to. Each entry succeeds or fails alone: ``failed``
lists ``(entry index, kind, message)`` of the refused ones (their write bytes are drained).
A write's ``fence`` (``fences``: one int64 per entry, or empty) names the allocation it writes
for; the server refuses one that a newer allocation of the same bytes supersedes
(``StaleWrite``, transfer/fences.py). 0 (or no ``fences``) is not fenced.

The reply's ``request_id`` echoes the request's, so a pipelining client can match them. A
malformed or oversized frame closes the connection (the stream cannot be resynchronised).
"""

from __future__ import annotations

import msgspec
import numpy as np

from kvcake.core import framing


class WriteReq(msgspec.Struct, tag=True, array_like=True):
    segment: str
    offset: int
    fence: int = 0  # the writer's allocation (transfer/fences.py); 0 = not fenced


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


class WriteV(msgspec.Struct, tag=True, array_like=True):
    segments: list[str]
    desc: bytes
    fences: bytes = b""  # one little-endian int64 per entry (transfer/fences.py); b"": none


class ReadV(msgspec.Struct, tag=True, array_like=True):
    segments: list[str]
    desc: bytes


class AckV(msgspec.Struct, tag=True, array_like=True):
    failed: list[tuple[int, str, str]] = []


CODEC: framing.Codec[msgspec.Struct] = framing.Codec(
    WriteReq, ReadReq, Probe, Ack, Fail, WriteV, ReadV, AckV
)

# One vectored frame holds at most this many entries: each is one iovec of one sendmsg /
# recvmsg_into, and the kernel takes at most IOV_MAX (1024) per call.
MAX_ENTRIES = 512
DESC = np.dtype("<i8")


def encode_desc(rows: np.ndarray) -> bytes:
    """``rows``: an ``(n, 3)`` integer array of (segment index, offset, length)."""
    return np.ascontiguousarray(rows, dtype=DESC).tobytes()


def decode_fences(fences: bytes, entries: int) -> list[int]:
    """The per-entry fences of a ``WriteV`` (zeros when it carries none); ValueError when
    malformed."""
    if not fences:
        return [0] * entries
    if len(fences) != 8 * entries:
        raise ValueError(f"{len(fences)} bytes of fences for {entries} entries")
    out: list[int] = np.frombuffer(fences, dtype=DESC).tolist()
    return out


def decode_desc(desc: bytes) -> np.ndarray:
    """The ``(n, 3)`` int64 view of a ``desc`` (no copy); ValueError when it is malformed."""
    if len(desc) % 24:
        raise ValueError(f"descriptor table of {len(desc)} bytes is not a whole number of rows")
    return np.frombuffer(desc, dtype=DESC).reshape(-1, 3)


def request_limits(max_data: int) -> framing.FrameLimits:
    return framing.FrameLimits(max_meta=64 * 1024, max_data=max_data)
