"""core/native/halves.py: a large copy in two halves gives the bytes and sums of the whole
copy, never queues behind another caller's half, waits for its half even when its own fails,
and starts afresh in a forked child."""

from __future__ import annotations

import mmap
import os
import random
import threading
import time

import pytest

from kvcake.core import integrity, native
from kvcake.core.native import halves

pytestmark = pytest.mark.skipif(
    not native.AVAILABLE or not halves.HELPER.enabled, reason="needs the C helper and 2 CPUs"
)
N = halves.SPLIT_MIN + 3 * integrity.CHUNK + 12345  # odd tail: halves cut on a chunk


def _value(seed: int) -> memoryview:
    return memoryview(random.Random(seed).randbytes(N))


@pytest.mark.parametrize("flags", [0, native.STREAM, native.STREAM | native.BOUNCE])
def test_a_split_summing_copy_gives_the_whole_copys_bytes_and_sums(flags: int) -> None:
    value = _value(flags)
    seeds = integrity.chunk_seeds("k", 0, integrity.chunk_count(N))
    dst = memoryview(mmap.mmap(-1, N))
    before = halves.HELPER.splits
    sums = native.copy_sum(dst, value, integrity.CHUNK, seeds, flags)
    assert halves.HELPER.splits == before + 1
    assert sums == integrity.checksums("k", value)
    assert dst == value
    assert native.copy_sum(None, value, integrity.CHUNK, seeds, flags) == sums


@pytest.mark.parametrize("stream", [True, False])
def test_a_split_plain_copy_copies_every_byte(stream: bool) -> None:
    value = _value(7)
    dst = memoryview(mmap.mmap(-1, N))
    before = halves.HELPER.splits
    native.copy(dst, value, stream)
    assert halves.HELPER.splits == before + 1
    assert dst == value


def test_a_busy_helper_means_the_caller_copies_it_all_itself() -> None:
    value = _value(3)
    dst = memoryview(mmap.mmap(-1, N))
    gate = threading.Event()
    held = halves.HELPER.submit(gate.wait)  # another caller's half, still running
    assert held is not None
    try:
        before = halves.HELPER.splits
        sums = native.copy_sum(
            dst, value, integrity.CHUNK, integrity.chunk_seeds("k", 0, integrity.chunk_count(N))
        )
        assert halves.HELPER.splits == before  # not queued behind the busy helper
        assert sums == integrity.checksums("k", value) and dst == value
    finally:
        gate.set()
        held.result()


def test_a_failing_first_half_still_waits_for_the_second() -> None:
    done = []

    def second() -> None:
        time.sleep(0.2)
        done.append(True)

    def first() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        halves.in_halves(first, second)
    assert done == [True]  # the memory the helper used was not given back under it


def test_a_forked_child_starts_its_own_helper() -> None:
    value = _value(5)
    native.copy(memoryview(mmap.mmap(-1, N)), value)  # the parent's helper thread exists
    pid = os.fork()
    if pid == 0:  # the child: no helper thread came with the fork
        code = 1
        try:
            dst = memoryview(mmap.mmap(-1, N))
            native.copy(dst, value)
            code = 0 if dst == value and halves.HELPER.splits == 1 else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while (got := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if got[0] == 0:  # a child waiting on a helper thread the fork did not copy
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's copy never finished")
    assert os.waitstatus_to_exitcode(got[1]) == 0
