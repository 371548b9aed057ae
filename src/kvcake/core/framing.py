"""Length-prefixed binary frames with typed message structs — the wire format of every kvcake RPC.

A frame is a fixed 24-byte header, a msgpack-encoded message (a tagged ``msgspec.Struct``) and an
optional raw data section::

    magic "KC" | version u8 | flags u8 | request_id u64 | meta_len u32 | data_len u64   (little endian)
    meta (meta_len bytes, msgpack)
    data (data_len bytes, raw; bulk payload such as KV bytes)

Keeping bulk bytes out of msgpack lets a receiver ``recv_into`` them straight into their final
memory (zero copy) and a sender ``sendmsg`` them straight from registered memory.

Malformed, truncated or oversized frames raise :class:`~kvcake.core.errors.FramingError`
subclasses; a server catches those per connection and never crashes on them.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, Union

import msgspec
from typing_extensions import Buffer

from kvcake.core.auth import AUTH_MARK, ENV_HINT, AuthRequired
from kvcake.core.errors import FrameTooLarge, MalformedFrame, TruncatedFrame
from kvcake.core.iochunks import IO_CALL_BYTES, io_groups

MAGIC = b"KC"
VERSION = 1
HEADER = struct.Struct("<2sBBQIQ")
HEADER_SIZE = HEADER.size  # 24

M = TypeVar("M", bound=msgspec.Struct)


@dataclass(frozen=True)
class FrameLimits:
    """Largest sections a receiver accepts; anything bigger is refused before reading it."""

    max_meta: int = 16 * 1024 * 1024
    max_data: int = 4 * 1024**3


DEFAULT_LIMITS = FrameLimits()


@dataclass(frozen=True)
class FrameHeader:
    flags: int
    request_id: int
    meta_len: int
    data_len: int


class Codec(Generic[M]):
    """Encodes and decodes one protocol's messages: a closed set of tagged ``msgspec.Struct``
    types (declare them with ``tag=True`` so the decoder can tell them apart)."""

    def __init__(self, *types: type[M]):
        if not types:
            raise ValueError("a codec needs at least one message type")
        for t in types:
            if t.__struct_config__.tag is None:
                raise ValueError(f"{t.__name__} must be declared with tag=True")
        self.types = types
        union: Any = types[0] if len(types) == 1 else typing_union(types)
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(union)

    def encode(self, msg: M) -> bytes:
        if not isinstance(msg, self.types):
            raise TypeError(f"{type(msg).__name__} is not a message of this codec")
        return self._encoder.encode(msg)

    def decode(self, data: Buffer) -> M:
        try:
            return self._decoder.decode(data)  # type: ignore[no-any-return,unused-ignore]
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise MalformedFrame(f"undecodable message: {exc}") from exc


def typing_union(types: tuple[type, ...]) -> Any:
    return Union[types]  # noqa: UP007  (a runtime-built union needs the subscript form)


def pack_header(request_id: int, meta_len: int, data_len: int = 0, flags: int = 0) -> bytes:
    return HEADER.pack(MAGIC, VERSION, flags, request_id, meta_len, data_len)


def parse_header(buf: Buffer, limits: FrameLimits = DEFAULT_LIMITS) -> FrameHeader:
    """Validate and decode a 24-byte header."""
    view = memoryview(buf)
    if view.nbytes < HEADER_SIZE:
        raise TruncatedFrame(f"header needs {HEADER_SIZE} bytes, got {view.nbytes}")
    magic, version, flags, rid, meta_len, data_len = HEADER.unpack(view[:HEADER_SIZE])
    if magic != MAGIC:
        raise MalformedFrame(f"bad magic {bytes(magic)!r} (not a kvcake peer?)")
    if version != VERSION:
        if magic == MAGIC and version == AUTH_MARK:
            raise AuthRequired(f"the peer requires authentication (a shared secret): {ENV_HINT}")
        raise MalformedFrame(f"unsupported frame version {version} (this side speaks {VERSION})")
    if meta_len > limits.max_meta:
        raise FrameTooLarge(f"meta section {meta_len} bytes exceeds limit {limits.max_meta}")
    if data_len > limits.max_data:
        raise FrameTooLarge(f"data section {data_len} bytes exceeds limit {limits.max_data}")
    return FrameHeader(flags, rid, meta_len, data_len)


def pack_frame(
    codec: Codec[M], request_id: int, msg: M, data: Buffer = b"", flags: int = 0
) -> bytes:
    """A whole frame as one bytes object (copies ``data``; use :func:`send_frame` for bulk)."""
    meta = codec.encode(msg)
    body = memoryview(data)
    return pack_header(request_id, len(meta), body.nbytes, flags) + meta + bytes(body)


@dataclass
class Frame(Generic[M]):
    header: FrameHeader
    msg: M
    data: bytes


class FrameDecoder(Generic[M]):
    """Incremental decoder for byte streams (asyncio protocols, fuzzing): ``feed`` bytes, get
    back every frame completed so far. After an error the decoder is poisoned: the stream is
    unsynchronised, so the connection must be closed."""

    def __init__(self, codec: Codec[M], limits: FrameLimits = DEFAULT_LIMITS):
        self.codec = codec
        self.limits = limits
        self._buf = bytearray()
        self._failed: Exception | None = None

    def feed(self, chunk: Buffer) -> list[Frame[M]]:
        if self._failed is not None:
            raise self._failed
        self._buf += chunk
        frames: list[Frame[M]] = []
        try:
            while len(self._buf) >= HEADER_SIZE:
                hdr = parse_header(self._buf, self.limits)
                end = HEADER_SIZE + hdr.meta_len + hdr.data_len
                if len(self._buf) < end:
                    break
                meta_end = HEADER_SIZE + hdr.meta_len
                msg = self.codec.decode(bytes(self._buf[HEADER_SIZE:meta_end]))
                frames.append(Frame(hdr, msg, bytes(self._buf[meta_end:end])))
                del self._buf[:end]
        except Exception as exc:
            self._failed = exc
            raise
        return frames

    def close(self) -> None:
        """Signal end of stream; raises :class:`TruncatedFrame` if a frame was cut off."""
        if self._buf:
            raise TruncatedFrame(f"stream ended with {len(self._buf)} bytes of an unfinished frame")


# --- blocking sockets -------------------------------------------------------------------------


def recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` completely from ``sock`` (zero copy); EOF midway raises TruncatedFrame."""
    got, total = 0, view.nbytes
    while got < total:
        n = sock.recv_into(view[got:], min(total - got, IO_CALL_BYTES))
        if n == 0:
            raise TruncatedFrame(f"peer closed after {got} of {total} bytes")
        got += n


def read_header(sock: socket.socket, limits: FrameLimits = DEFAULT_LIMITS) -> FrameHeader | None:
    """Read one header; ``None`` on a clean EOF at a frame boundary."""
    buf = bytearray(HEADER_SIZE)
    view = memoryview(buf)
    n = sock.recv_into(view, HEADER_SIZE)
    if n == 0:
        return None
    if n < HEADER_SIZE:
        recv_exact_into(sock, view[n:])
    return parse_header(buf, limits)


def read_frame(
    sock: socket.socket, codec: Codec[M], limits: FrameLimits = DEFAULT_LIMITS
) -> Frame[M] | None:
    """Read a whole frame (data section into a new buffer); ``None`` on clean EOF."""
    hdr = read_header(sock, limits)
    if hdr is None:
        return None
    meta = bytearray(hdr.meta_len)
    recv_exact_into(sock, memoryview(meta))
    msg = codec.decode(meta)
    data = bytearray(hdr.data_len)
    if hdr.data_len:
        recv_exact_into(sock, memoryview(data))
    return Frame(hdr, msg, bytes(data))


def send_frame(
    sock: socket.socket,
    codec: Codec[M],
    request_id: int,
    msg: M,
    data: Buffer | None = None,
    flags: int = 0,
) -> None:
    """Send a frame; ``data`` is sent straight from the caller's memory (scatter/gather)."""
    sendall_parts(sock, frame_parts(codec, request_id, msg, data, flags))


def frame_parts(
    codec: Codec[M], request_id: int, msg: M, data: Buffer | None = None, flags: int = 0
) -> list[bytes | memoryview]:
    """A frame as [header + meta, data] without copying ``data`` (data omitted when empty)."""
    meta = codec.encode(msg)
    body = memoryview(data).cast("B") if data is not None else memoryview(b"")
    parts: list[bytes | memoryview] = [
        pack_header(request_id, len(meta), body.nbytes, flags) + meta
    ]
    if body.nbytes:
        parts.append(body)
    return parts


def sendall_parts(sock: socket.socket, parts: Sequence[Buffer]) -> None:
    """``sendmsg`` until every byte of every part is out (no concatenation copies), at most
    ``IO_CALL_BYTES`` per call (see :mod:`kvcake.core.iochunks`)."""
    for views in io_groups(parts):
        while views:
            sent = sock.sendmsg(views)
            while sent and views:
                if sent >= views[0].nbytes:
                    sent -= views[0].nbytes
                    views.pop(0)
                else:
                    views[0] = views[0][sent:]
                    sent = 0


# --- asyncio streams --------------------------------------------------------------------------


async def read_frame_async(
    reader: asyncio.StreamReader, codec: Codec[M], limits: FrameLimits = DEFAULT_LIMITS
) -> Frame[M] | None:
    """Async twin of :func:`read_frame`; ``None`` on clean EOF at a frame boundary."""
    try:
        head = await reader.readexactly(HEADER_SIZE)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise TruncatedFrame(f"stream ended inside a header ({len(exc.partial)} bytes)") from exc
    hdr = parse_header(head, limits)
    try:
        meta = await reader.readexactly(hdr.meta_len)
        data = await reader.readexactly(hdr.data_len) if hdr.data_len else b""
    except asyncio.IncompleteReadError as exc:
        raise TruncatedFrame("stream ended inside a frame body") from exc
    return Frame(hdr, codec.decode(meta), data)


def write_frame_async(
    writer: asyncio.StreamWriter,
    codec: Codec[M],
    request_id: int,
    msg: M,
    data: Buffer | None = None,
    flags: int = 0,
) -> None:
    """Queue a frame on an asyncio writer (caller awaits ``writer.drain()``)."""
    writer.writelines(frame_parts(codec, request_id, msg, data, flags))
