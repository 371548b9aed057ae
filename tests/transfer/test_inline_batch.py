"""The inline batch path: a batch of one op between one local and one remote segment that a
single vectored frame carries runs in the caller's thread (``TcpTransport.run_vectors``),
with the general path's outcomes: per-request results in order, refusals of single entries,
failover after a broken path, and the general path for everything else."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvcake.core.ids import BatchId, SegmentName
from kvcake.transfer import Op, TransferEngine, TransferRequest
from kvcake.transfer.errors import OutOfRange
from kvcake.transfer.planner import run_results, uniform_runs

from .conftest import EngineFactory, pattern
from .test_tcp_paths import NICS, cfg

S = SegmentName
BLOCK = 4096


def count_inline(engine: TransferEngine) -> list[int]:
    """Count the frames the engine's TCP transport sends as one-frame batches (wraps
    ``run_vectors``, which sends a list of them back to back)."""
    tcp: Any = engine.transports["tcp"]
    calls = [0]
    inner: Callable[..., Any] = tcp.run_vectors

    def spy(plans: Any) -> Any:
        calls[0] += len(plans)
        return inner(plans)

    tcp.run_vectors = spy
    return calls


def permuted(op: Op, n: int, block: int = BLOCK) -> list[TransferRequest]:
    """Local contiguous, target permuted: nothing coalesces."""
    return [
        TransferRequest(op, S("a"), i * block, S("b"), ((i * 5) % n) * block, block)
        for i in range(n)
    ]


@pytest.mark.parametrize("op", [Op.WRITE, Op.READ])
def test_a_batch_runs_as_one_inline_frame_byte_exact(make_engine: EngineFactory, op: Op) -> None:
    a = make_engine(protocol="tcp")
    b = make_engine()
    n = 16
    ours, theirs = pattern(n * BLOCK, seed=1), pattern(n * BLOCK, seed=2)
    a.register_memory("a", ours)
    b.register_memory("b", theirs)
    calls = count_inline(a)
    want = bytearray(n * BLOCK)
    for i in range(n):
        t = ((i * 5) % n) * BLOCK
        if op is Op.WRITE:
            want[t : t + BLOCK] = ours[i * BLOCK : (i + 1) * BLOCK]
        else:
            want[i * BLOCK : (i + 1) * BLOCK] = theirs[t : t + BLOCK]
    res = a.transfer(permuted(op, n))
    assert res.ok and len(res.results) == n
    assert calls == [1]
    assert (theirs if op is Op.WRITE else ours) == want
    a.pool.check()


def test_one_refused_entry_fails_only_its_members(make_engine: EngineFactory) -> None:
    a = make_engine(protocol="tcp")
    b = make_engine()
    a.register_memory("a", pattern(8 * BLOCK, seed=3))
    big = bytearray(8 * BLOCK)
    b.register_memory("b", big)
    a.segment_info("b")  # cache the 32 KiB size
    b.unregister("b")
    small = bytearray(4 * BLOCK)
    b.register_memory("b", small)  # same name, 16 KiB: the server refuses the tail
    calls = count_inline(a)
    # Requests 0 and 2 are adjacent (one run past the end); 1 and 3 in bounds.
    reqs = [
        TransferRequest(Op.WRITE, S("a"), 0, S("b"), 6 * BLOCK, BLOCK),
        TransferRequest(Op.WRITE, S("a"), BLOCK * 2, S("b"), 0, BLOCK),
        TransferRequest(Op.WRITE, S("a"), BLOCK, S("b"), 7 * BLOCK, BLOCK),
        TransferRequest(Op.WRITE, S("a"), BLOCK * 3, S("b"), 2 * BLOCK, BLOCK),
    ]
    res = a.transfer(reqs)
    assert calls == [1]
    assert [r.error_type for r in res.results] == ["OutOfRange", None, "OutOfRange", None]
    mem = a._segments.get("a").view
    assert small[:BLOCK] == mem[2 * BLOCK : 3 * BLOCK]
    assert small[2 * BLOCK : 3 * BLOCK] == mem[3 * BLOCK : 4 * BLOCK]


def run_batch(engine: TransferEngine, api: str, reqs: list[TransferRequest]) -> Any:
    """``transfer()`` it, or ``submit()`` it and ``wait()`` for it."""
    if api == "transfer":
        return engine.transfer(reqs)
    return engine.wait(engine.submit(reqs), timeout=30)


@pytest.mark.parametrize("api", ["transfer", "submit"])
def test_a_path_broken_under_a_one_frame_batch_fails_over(
    make_engine: EngineFactory, api: str
) -> None:
    a = make_engine(protocol="tcp", config=cfg(probe_interval_s=10.0))
    b = make_engine(listen_hosts=NICS[:2])
    mem = pattern(16 * BLOCK, seed=4)
    b.register_memory("b", mem)
    out = bytearray(16 * BLOCK)
    a.register_memory("a", out)
    assert run_batch(a, api, permuted(Op.READ, 16)).ok  # pools a connection on the first path
    first = b.addresses[0]
    b.server.close_address(first)  # that connection is now dead
    out[:] = bytes(len(out))
    calls = count_inline(a)
    res = run_batch(a, api, permuted(Op.READ, 16))
    assert res.ok, res
    assert calls == [1]  # the frame was tried, then the general path on the other NIC
    assert a.health.down() == [first]
    for i in range(16):
        t = ((i * 5) % 16) * BLOCK
        assert out[i * BLOCK : (i + 1) * BLOCK] == mem[t : t + BLOCK]


def test_mixed_or_bad_batches_take_the_general_path(make_engine: EngineFactory) -> None:
    a = make_engine(protocol="tcp")
    b = make_engine()
    a.register_memory("a", pattern(4 * BLOCK, seed=5))
    a.register_memory("a2", pattern(4 * BLOCK, seed=6))
    b.register_memory("b", bytearray(4 * BLOCK))
    calls = count_inline(a)
    bad = [
        TransferRequest(Op.WRITE, S("a"), 0, S("b"), 0, BLOCK),
        TransferRequest(Op.WRITE, S("a"), 0, S("b"), 4 * BLOCK, BLOCK),  # out of range
    ]
    assert [r.error_type for r in a.transfer(bad).results] == [None, "OutOfRange"]
    mixed = [
        TransferRequest(Op.WRITE, S("a"), 0, S("b"), 0, BLOCK),
        TransferRequest(Op.READ, S("a2"), 0, S("b"), BLOCK, BLOCK),
    ]
    assert a.transfer(mixed).ok
    assert calls == [0]


def test_uniform_runs_coalesces_and_refuses_what_the_general_path_must_judge() -> None:
    def req(lo: int, to: int, n: int, op: Op = Op.READ, t: str = "b") -> TransferRequest:
        return TransferRequest(op, S("a"), lo, S(t), to, n)

    plan = uniform_runs([req(8, 108, 4), req(0, 100, 8), req(20, 200, 4)], 64, 256)
    assert plan == (Op.READ, [(0, 100, 12, [1, 0]), (20, 200, 4, [2])], 16)
    assert uniform_runs([req(0, 0, 4), req(4, 4, 4, op=Op.WRITE)], 64, 64) is None
    assert uniform_runs([req(0, 0, 4), req(4, 4, 4, t="c")], 64, 64) is None
    assert uniform_runs([req(0, 0, 4), req(62, 4, 4)], 64, 64) is None  # local overrun
    assert uniform_runs([req(0, 0, 4), req(4, 62, 4)], 64, 64) is None  # target overrun
    assert uniform_runs([req(0, 0, 4), req(4, -1, 4)], 64, 64) is None
    assert uniform_runs([req(0, 0, 4), req(4, 4, 0)], 64, 64) is None
    runs = [(0, 100, 12, [1, 0]), (20, 200, 4, [2])]
    res = run_results(BatchId(7), 3, runs, {1: OutOfRange("no")})
    assert [r.ok for r in res.results] == [True, True, False]
    assert res.results[2].error_type == "OutOfRange"
    every = run_results(BatchId(7), 3, runs, OutOfRange("all"))
    assert not any(r.ok for r in every.results)
    assert run_results(BatchId(7), 3, runs, None).ok


# --- submit(): the same batches as one task per batch (no per-request slices) ---------------


@pytest.mark.parametrize("op", [Op.WRITE, Op.READ])
def test_submitted_batches_run_as_one_frame_each_and_land_byte_exact(
    make_engine: EngineFactory, op: Op
) -> None:
    a = make_engine(protocol="tcp")
    b = make_engine()
    n, layers = 16, 6
    ours, theirs = pattern(layers * n * BLOCK, seed=7), pattern(layers * n * BLOCK, seed=8)
    a.register_memory("a", ours)
    b.register_memory("b", theirs)
    want = bytearray(theirs if op is Op.WRITE else ours)
    batches = []
    for k in range(layers):  # one batch per "layer", submitted back to back
        base = k * n * BLOCK
        reqs = [
            TransferRequest(
                op, S("a"), base + i * BLOCK, S("b"), base + ((i * 5) % n) * BLOCK, BLOCK
            )
            for i in range(n)
        ]
        for r in reqs:
            src = ours if op is Op.WRITE else theirs
            s_off, d_off = (
                (r.local_offset, r.target_offset)
                if op is Op.WRITE
                else (r.target_offset, r.local_offset)
            )
            want[d_off : d_off + BLOCK] = src[s_off : s_off + BLOCK]
        batches.append(reqs)
    calls = count_inline(a)
    ids = [a.submit(reqs) for reqs in batches]
    results = [a.wait(i, timeout=30) for i in ids]
    assert all(r.ok and len(r.results) == n for r in results)
    assert calls == [layers]
    assert (theirs if op is Op.WRITE else ours) == want
    a.pool.check()


def test_a_submitted_frame_with_a_refused_entry_fails_only_its_members(
    make_engine: EngineFactory,
) -> None:
    a = make_engine(protocol="tcp")
    b = make_engine()
    a.register_memory("a", pattern(4 * BLOCK, seed=9))
    b.register_memory("b", bytearray(8 * BLOCK))
    a.segment_info("b")  # cache the 32 KiB size
    b.unregister("b")
    b.register_memory("b", bytearray(2 * BLOCK))  # the server refuses what is past 8 KiB
    calls = count_inline(a)
    reqs = [
        TransferRequest(Op.WRITE, S("a"), 0, S("b"), 0, BLOCK),
        TransferRequest(Op.WRITE, S("a"), 2 * BLOCK, S("b"), 6 * BLOCK, BLOCK),
    ]
    res = a.wait(a.submit(reqs), timeout=30)
    assert calls == [1]
    assert [r.error_type for r in res.results] == [None, "OutOfRange"]


def test_an_unexpected_error_in_a_submitted_frame_reaches_the_waiter(
    make_engine: EngineFactory,
) -> None:
    """A bug or a released buffer under the frame fails every request of the batch with a
    TransferError; the waiter never hangs and the engine keeps working."""
    a = make_engine(protocol="tcp")
    b = make_engine()
    a.register_memory("a", pattern(16 * BLOCK, seed=11))
    b.register_memory("b", bytearray(16 * BLOCK))
    tcp: Any = a.transports["tcp"]
    inner = tcp.run_vectors

    def boom(*args: Any) -> Any:
        raise RuntimeError("simulated bug")

    tcp.run_vectors = boom
    res = a.wait(a.submit(permuted(Op.WRITE, 16)), timeout=30)
    assert not any(r.ok for r in res.results)
    assert {r.error_type for r in res.results} == {"TransferError"}
    assert "simulated bug" in (res.results[0].error or "")
    tcp.run_vectors = inner
    assert a.wait(a.submit(permuted(Op.WRITE, 16)), timeout=30).ok
