import asyncio
import socket
import threading

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcake.core.errors import FrameTooLarge, FramingError, MalformedFrame, TruncatedFrame
from kvcake.core.framing import (
    HEADER_SIZE,
    Codec,
    FrameDecoder,
    FrameLimits,
    pack_frame,
    pack_header,
    parse_header,
    read_frame,
    read_frame_async,
    send_frame,
    write_frame_async,
)


class Ping(msgspec.Struct, tag=True):
    n: int


class Put(msgspec.Struct, tag=True):
    key: str
    size: int


CODEC: Codec[Ping | Put] = Codec(Ping, Put)


def test_roundtrip_with_data_and_ids() -> None:
    dec = FrameDecoder(CODEC)
    frames = dec.feed(pack_frame(CODEC, 7, Put("k", 3), b"abc") + pack_frame(CODEC, 8, Ping(1)))
    assert [(f.header.request_id, f.msg, f.data) for f in frames] == [
        (7, Put("k", 3), b"abc"),
        (8, Ping(1), b""),
    ]
    dec.close()


def test_byte_at_a_time() -> None:
    blob = pack_frame(CODEC, 1, Ping(5), b"xyz") * 3
    dec = FrameDecoder(CODEC)
    got = [f for i in range(len(blob)) for f in dec.feed(blob[i : i + 1])]
    assert [f.msg for f in got] == [Ping(5)] * 3


def test_malformed_inputs() -> None:
    with pytest.raises(MalformedFrame, match="magic"):
        parse_header(b"XX" + bytes(HEADER_SIZE - 2))
    good = pack_header(1, 3)
    with pytest.raises(MalformedFrame, match="version"):
        parse_header(good[:2] + b"\x09" + good[3:])
    with pytest.raises(TruncatedFrame):
        parse_header(good[:10])
    with pytest.raises(FrameTooLarge):
        parse_header(pack_header(1, 100), FrameLimits(max_meta=10))
    with pytest.raises(FrameTooLarge):
        parse_header(pack_header(1, 1, 2**40))
    # A well-framed body that is not one of the codec's messages.
    junk = msgspec.msgpack.encode({"type": "Nope"})
    with pytest.raises(MalformedFrame, match="undecodable"):
        FrameDecoder(CODEC).feed(pack_header(1, len(junk)) + junk)
    dec = FrameDecoder(CODEC)
    dec.feed(pack_frame(CODEC, 1, Ping(1))[:-1])
    with pytest.raises(TruncatedFrame):
        dec.close()
    with pytest.raises(TypeError):
        CODEC.encode(msgspec.Struct())  # type: ignore[arg-type]


def test_decoder_is_poisoned_after_error() -> None:
    dec = FrameDecoder(CODEC)
    with pytest.raises(MalformedFrame):
        dec.feed(b"ZZ" + bytes(40))
    with pytest.raises(MalformedFrame):
        dec.feed(pack_frame(CODEC, 1, Ping(1)))


def test_untagged_struct_rejected() -> None:
    class Plain(msgspec.Struct):
        x: int

    with pytest.raises(ValueError, match="tag=True"):
        Codec(Plain)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes_only_raise_framing_errors(blob: bytes) -> None:
    dec = FrameDecoder(CODEC, FrameLimits(max_meta=1024, max_data=1024))
    try:
        dec.feed(blob)
        dec.close()
    except FramingError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**64 - 1), st.text(max_size=30), st.binary(max_size=100), st.data())
def test_fuzz_mutated_frames(rid: int, key: str, data: bytes, draw: st.DataObject) -> None:
    blob = bytearray(pack_frame(CODEC, rid, Put(key, len(data)), data))
    assert FrameDecoder(CODEC).feed(bytes(blob))[0].header.request_id == rid
    pos = draw.draw(st.integers(0, len(blob) - 1))
    blob[pos] ^= draw.draw(st.integers(1, 255))
    cut = draw.draw(st.integers(0, len(blob)))
    dec = FrameDecoder(CODEC, FrameLimits(max_meta=4096, max_data=4096))
    try:
        dec.feed(bytes(blob[:cut]))
        dec.close()
    except FramingError:
        pass


def test_blocking_socket_roundtrip_and_truncation() -> None:
    a, b = socket.socketpair()
    payload = bytes(range(256)) * 1000
    t = threading.Thread(target=send_frame, args=(a, CODEC, 42, Put("big", len(payload)), payload))
    t.start()
    f = read_frame(b, CODEC)
    t.join()
    assert f is not None and f.header.request_id == 42 and f.data == payload
    a.sendall(pack_frame(CODEC, 1, Ping(1))[:-2])
    a.close()
    with pytest.raises(TruncatedFrame):
        read_frame(b, CODEC)
    b.close()
    c, d = socket.socketpair()
    c.close()
    assert read_frame(d, CODEC) is None
    d.close()


def test_asyncio_roundtrip() -> None:
    async def main() -> None:
        received: list[object] = []

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while (f := await read_frame_async(r, CODEC)) is not None:
                received.append((f.msg, f.data))
            w.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _r, w = await asyncio.open_connection("127.0.0.1", port)
        write_frame_async(w, CODEC, 1, Put("a", 2), b"hi")
        write_frame_async(w, CODEC, 2, Ping(3))
        await w.drain()
        w.close()
        await w.wait_closed()
        for _ in range(100):
            if len(received) == 2:
                break
            await asyncio.sleep(0.01)
        server.close()
        assert received == [(Put("a", 2), b"hi"), (Ping(3), b"")]

    asyncio.run(main())
