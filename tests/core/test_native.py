"""kvcake.core.native (the fused copy-and-checksum in C) computes exactly core/integrity.py's
sums and copies every byte; the integrity and store paths that use it give the verdicts the
pure-Python path gives. ``make test`` builds it (``make native``), so it must be there."""

from __future__ import annotations

import random

import pytest

from kvcake.core import integrity, native
from kvcake.store.verify import write_summing

SIZES = [
    1,
    4095,
    4096,
    4097,
    256 * 1024,
    integrity.CHUNK,
    integrity.CHUNK + 1,
    3 * integrity.CHUNK - 7,
]


def _value(size: int, seed: int) -> memoryview:
    return memoryview(random.Random(seed).randbytes(size))


def test_it_is_built() -> None:
    assert native.AVAILABLE, "kvcake.core.native is not built: run `make native`"


FLAGS = [0, native.STREAM, native.STREAM | native.BOUNCE]


@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("size", SIZES)
def test_copy_sum_matches_the_python_sums_and_copies_every_byte(size: int, flags: int) -> None:
    value = _value(size, size)
    seed = integrity.key_seed("k")
    seeds = [integrity.chunk_seed(seed, i) for i in range(integrity.chunk_count(size))]
    for shift in (0, 5):  # streamed stores need aligned addresses: an unaligned head too
        room = memoryview(bytearray(size + 2 * shift + 64))
        dst = room[shift : shift + size]
        got = native.copy_sum(dst, value, integrity.CHUNK, seeds, flags)
        assert got == integrity.checksums("k", value)
        assert dst == value
        assert not any(room[:shift]) and not any(room[shift + size :])  # nothing around it
    assert native.copy_sum(None, value, integrity.CHUNK, seeds) == integrity.checksums("k", value)


@pytest.mark.parametrize("size", [0, 17, native.STREAM_MIN - 1, native.STREAM_MIN, 3 << 20])
def test_copy_copies_every_byte_and_nothing_else(size: int) -> None:
    value = _value(size, 9)
    room = memoryview(bytearray(size + 70))
    native.copy(room[3 : 3 + size], value)
    assert room[3 : 3 + size] == value
    assert not any(room[:3]) and not any(room[3 + size :])
    with pytest.raises(ValueError):  # C or a slice assignment: a wrong size is refused
        native.copy(room[: size + 1], value)


@pytest.mark.parametrize("flags", [0, native.STREAM])
def test_scatter_and_the_copy_list_stream_the_same_bytes(flags: int) -> None:
    size = 2 * integrity.CHUNK + 4099
    value = _value(size, 4)
    ranges = [(1, memoryview(bytearray(70_000))), (100_001, memoryview(bytearray(1_500_000)))]
    seeds = integrity.chunk_seeds("k", 0, integrity.chunk_count(size))
    done, sums = native.scatter_sum_many([(value, ranges, seeds)], integrity.CHUNK, flags=flags)
    assert done == 1 and sums[0] == integrity.checksums("k", value)
    for off, buf in ranges:
        assert buf == value[off : off + buf.nbytes]
    outs = [memoryview(bytearray(b.nbytes)) for _, b in ranges]
    src = memoryview(bytearray(value))
    base = native._address(src)
    native.CopyList(
        [(base + off, o) for (off, _), o in zip(ranges, outs, strict=True)], flags
    ).run()
    assert all(o == b for o, (_, b) in zip(outs, ranges, strict=True))


def test_bad_arguments_are_refused() -> None:
    value = _value(integrity.CHUNK + 1, 1)
    with pytest.raises(ValueError):
        native.copy_sum(None, value, integrity.CHUNK, [1])  # two chunks, one seed
    with pytest.raises(ValueError):
        native.copy_sum(memoryview(bytearray(5)), value, integrity.CHUNK, [1, 2])


@pytest.mark.parametrize("size", [integrity.NATIVE_MIN, 2 * integrity.CHUNK + 3])
def test_copy_verified_finds_the_same_bad_chunk_both_ways(size: int, monkeypatch) -> None:
    value = bytearray(_value(size, 7))
    sums = integrity.checksums("k", value)
    value[size - 2] ^= 1  # corrupt the last chunk
    verdicts = []
    for available in (True, False):
        monkeypatch.setattr(native, "AVAILABLE", available)
        out = memoryview(bytearray(size))
        verdicts.append(integrity.copy_verified("k", sums, size, 0, out, memoryview(value)))
        assert out == memoryview(value)
    assert verdicts[0] == verdicts[1] == [integrity.chunk_count(size) - 1]


def test_write_summing_gives_the_same_sums_both_ways(monkeypatch) -> None:
    value = _value(2 * integrity.CHUNK + 11, 3)
    got = []
    for available in (True, False):
        monkeypatch.setattr(native, "AVAILABLE", available)
        dst = memoryview(bytearray(value.nbytes + 8))
        got.append(write_summing("key", value, dst))
        assert dst[: value.nbytes] == value
    assert got[0] == got[1] == integrity.checksums("key", value)
