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


@pytest.mark.parametrize("size", SIZES)
def test_copy_sum_matches_the_python_sums_and_copies_every_byte(size: int) -> None:
    value = _value(size, size)
    seed = integrity.key_seed("k")
    seeds = [integrity.chunk_seed(seed, i) for i in range(integrity.chunk_count(size))]
    dst = memoryview(bytearray(size))
    assert native.copy_sum(dst, value, integrity.CHUNK, seeds) == integrity.checksums("k", value)
    assert dst == value
    assert native.copy_sum(None, value, integrity.CHUNK, seeds) == integrity.checksums("k", value)


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
