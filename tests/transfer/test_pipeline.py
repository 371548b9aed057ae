"""Submitted one-frame batches of one target segment and op go out back to back on one
connection (``transfer/pipeline.py``): in submit order, at most ``window`` per round, each
batch settled exactly once — by its reply, by the general path after a broken path, or by the
error that aborted its round."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from kvcake.core.ids import SegmentName
from kvcake.transfer import Op, TransferConfig, TransferEngine, TransferRequest
from kvcake.transfer.pipeline import FramePipeline

from .conftest import EngineFactory, pattern
from .test_tcp_paths import NICS

S = SegmentName
BLOCK = 4096
N = 8  # blocks per batch ("layer")


def layer(op: Op, k: int) -> list[TransferRequest]:
    base = k * N * BLOCK
    return [
        TransferRequest(op, S("a"), base + i * BLOCK, S("b"), base + ((i * 3) % N) * BLOCK, BLOCK)
        for i in range(N)
    ]


class Rounds:
    """Records each round's frame count. The first round, once started, waits for
    :meth:`release`: batches submitted after :meth:`submit_first` returns queue behind it."""

    def __init__(self, engine: TransferEngine, fail_first: bool = False):
        self.engine = engine
        self.sizes: list[int] = []
        self.started = threading.Event()
        self.gate = threading.Event()
        tcp: Any = engine.transports["tcp"]
        inner = tcp.run_vectors

        def spy(plans: Any) -> Any:
            self.sizes.append(len(plans))
            if len(self.sizes) == 1:
                self.started.set()
                assert self.gate.wait(30)
                if fail_first:
                    raise RuntimeError("simulated bug")
            return inner(plans)

        tcp.run_vectors = spy

    def submit_first(self, reqs: list[TransferRequest]) -> Any:
        bid = self.engine.submit(reqs)
        assert self.started.wait(30)
        return bid

    def release(self) -> None:
        self.gate.set()


def expect(op: Op, ours: bytearray, theirs: bytearray, layers: int) -> bytes:
    want = bytearray(theirs if op is Op.WRITE else ours)
    for k in range(layers):
        for r in layer(op, k):
            if op is Op.WRITE:
                want[r.target_offset : r.target_offset + BLOCK] = ours[
                    r.local_offset : r.local_offset + BLOCK
                ]
            else:
                want[r.local_offset : r.local_offset + BLOCK] = theirs[
                    r.target_offset : r.target_offset + BLOCK
                ]
    return bytes(want)


@pytest.mark.parametrize("op", [Op.WRITE, Op.READ])
def test_batches_queued_behind_a_round_go_out_together_in_order(
    make_engine: EngineFactory, op: Op
) -> None:
    layers = 10
    a = make_engine(protocol="tcp")
    b = make_engine()
    ours, theirs = pattern(layers * N * BLOCK, seed=1), pattern(layers * N * BLOCK, seed=2)
    want = expect(op, ours, theirs, layers)
    a.register_memory("a", ours)
    b.register_memory("b", theirs)
    rounds = Rounds(a)
    ids = [rounds.submit_first(layer(op, 0))] + [a.submit(layer(op, k)) for k in range(1, layers)]
    rounds.release()
    assert all(a.wait(i, timeout=30).ok for i in ids)
    assert rounds.sizes == [1, layers - 1]  # the first round, then all queued behind it
    assert (theirs if op is Op.WRITE else ours) == want
    a.pool.check()


def test_a_round_carries_at_most_window_frames(make_engine: EngineFactory) -> None:
    a = make_engine(protocol="tcp", config=TransferConfig(window=3, io_timeout_s=5.0))
    b = make_engine()
    a.register_memory("a", pattern(8 * N * BLOCK, seed=3))
    b.register_memory("b", bytearray(8 * N * BLOCK))
    rounds = Rounds(a)
    ids = [rounds.submit_first(layer(Op.WRITE, 0))] + [
        a.submit(layer(Op.WRITE, k)) for k in range(1, 8)
    ]
    rounds.release()
    assert all(a.wait(i, timeout=30).ok for i in ids)
    assert rounds.sizes == [1, 3, 3, 1]


def test_reads_and_writes_of_one_segment_queue_apart(make_engine: EngineFactory) -> None:
    """Different ops never share a round (a round of one op cannot block both sides)."""
    a = make_engine(protocol="tcp")
    b = make_engine()
    a.register_memory("a", pattern(4 * N * BLOCK, seed=4))
    b.register_memory("b", pattern(4 * N * BLOCK, seed=5))
    rounds = Rounds(a)
    w = [rounds.submit_first(layer(Op.WRITE, 0)), a.submit(layer(Op.WRITE, 1))]
    r = [a.wait(a.submit(layer(Op.READ, k)), timeout=30) for k in (2, 3)]  # not held up
    assert all(x.ok for x in r)
    rounds.release()
    assert all(a.wait(i, timeout=30).ok for i in w)
    assert rounds.sizes[0] == 1 and rounds.sizes[-1] == 1 and sum(rounds.sizes) == 4


def test_a_path_broken_under_a_round_sends_its_batches_through_the_general_path(
    make_engine: EngineFactory,
) -> None:
    layers = 6
    a = make_engine(protocol="tcp", config=TransferConfig(io_timeout_s=5.0, probe_interval_s=10))
    b = make_engine(listen_hosts=NICS[:2])
    theirs = pattern(layers * N * BLOCK, seed=6)
    b.register_memory("b", theirs)
    ours = bytearray(layers * N * BLOCK)
    a.register_memory("a", ours)
    assert a.wait(a.submit(layer(Op.READ, 0)), timeout=30).ok  # pools a connection
    first = b.addresses[0]
    b.server.close_address(first)  # the pooled connection is now dead
    ours[:] = bytes(len(ours))
    want = expect(Op.READ, ours, theirs, layers)
    rounds = Rounds(a)
    ids = [rounds.submit_first(layer(Op.READ, 0))]
    ids += [a.submit(layer(Op.READ, k)) for k in range(1, layers)]
    rounds.release()
    results = [a.wait(i, timeout=30) for i in ids]
    assert all(r.ok for r in results), results
    assert a.health.down() == [first]
    assert ours == want


def test_a_round_that_raises_fails_its_batches_and_the_next_round_runs(
    make_engine: EngineFactory,
) -> None:
    a = make_engine(protocol="tcp")
    b = make_engine()
    a.register_memory("a", pattern(4 * N * BLOCK, seed=7))
    b.register_memory("b", bytearray(4 * N * BLOCK))
    rounds = Rounds(a, fail_first=True)
    first = rounds.submit_first(layer(Op.WRITE, 0))
    rest = [a.submit(layer(Op.WRITE, k)) for k in (1, 2, 3)]
    rounds.release()
    bad = a.wait(first, timeout=30)
    assert {r.error_type for r in bad.results} == {"TransferError"}
    assert all(a.wait(i, timeout=30).ok for i in rest)
    assert a._pipeline.queued() == 0


def test_the_pipeline_refuses_a_zero_window() -> None:
    with pytest.raises(ValueError):
        FramePipeline(0, 1, lambda *_: None, lambda *_: None)


def test_a_peer_that_dies_under_a_round_fails_every_queued_batch_without_hanging(
    make_engine: EngineFactory,
) -> None:
    """The only path goes away while a round is held open: the round's frames and the
    batches queued behind it all settle with a typed path error (none hangs), and the engine
    still serves once the peer is back."""
    a = make_engine(protocol="tcp", config=TransferConfig(io_timeout_s=5.0, probe_interval_s=0.05))
    b = make_engine()
    a.register_memory("a", pattern(6 * N * BLOCK, seed=12))
    b.register_memory("b", bytearray(6 * N * BLOCK))
    assert a.wait(a.submit(layer(Op.WRITE, 0)), timeout=30).ok  # pools a connection
    rounds = Rounds(a)
    ids = [rounds.submit_first(layer(Op.WRITE, 0))]
    ids += [a.submit(layer(Op.WRITE, k)) for k in range(1, 6)]
    only = b.addresses[0]
    b.server.close_address(only)  # the peer's only NIC dies under the held round
    rounds.release()
    results = [a.wait(i, timeout=30) for i in ids]
    assert all(not r.ok for r in results)
    assert {x.error_type for r in results for x in r.results} <= {"NoPathAvailable", "PathFailure"}
    assert a._pipeline.queued() == 0
    b.server.reopen_address(only)
    deadline = time.monotonic() + 10
    while not a.wait(a.submit(layer(Op.WRITE, 1)), timeout=30).ok:
        assert time.monotonic() < deadline, "the engine never recovered"
        time.sleep(0.1)
