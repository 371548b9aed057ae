"""The batch API over both transports: every request type, bad requests failing alone,
status/wait, conveniences, concurrency."""

from __future__ import annotations

import threading
import zlib

import numpy as np
import pytest

from kvcake.core.errors import TransferError
from kvcake.core.ids import BatchId, SegmentName
from kvcake.transfer import (
    InvalidRequest,
    Op,
    OutOfRange,
    SegmentExists,
    TransferRequest,
    UnknownBatch,
    UnknownSegment,
)

from .conftest import EngineFactory, pattern

S = SegmentName


@pytest.fixture(params=["tcp", "shm"])
def pair(request: pytest.FixtureRequest, make_engine: EngineFactory):  # type: ignore[no-untyped-def]
    """Initiator ``a`` (local segment ``a``) and target engine ``b`` (segment ``b``)."""
    a = make_engine(protocol=request.param)
    b = make_engine()
    local = pattern(1 << 20, seed=1)
    a.register_memory("a", local)
    target = b.allocate_segment("b", 2 << 20)
    return a, b, local, target


def test_write_then_read_registered(pair) -> None:  # type: ignore[no-untyped-def]
    a, _b, local, target = pair
    res = a.wait(a.submit([TransferRequest(Op.WRITE, S("a"), 0, S("b"), 4096, 1 << 20)]), 10)
    assert res.ok
    assert bytes(target[4096 : 4096 + (1 << 20)]) == bytes(local)
    local[:] = bytes(len(local))
    a.transfer_sync_read("b", "a", 0, 4096, 1 << 20)
    assert zlib.crc32(local) == zlib.crc32(target[4096 : 4096 + (1 << 20)])


def test_bad_requests_fail_alone(pair) -> None:  # type: ignore[no-untyped-def]
    a, _b, local, target = pair
    reqs = [
        TransferRequest(Op.WRITE, S("a"), 0, S("b"), 0, 100),
        TransferRequest(Op.WRITE, S("a"), 0, S("nope"), 0, 100),
        TransferRequest(Op.WRITE, S("a"), 0, S("b"), (2 << 20) - 10, 100),
        TransferRequest(Op.READ, S("a"), 0, S("b"), 0, 0),
        TransferRequest(Op.READ, S("a"), 0, S("b"), 0, -5),
        TransferRequest(Op.READ, S("a"), -1, S("b"), 0, 10),
        TransferRequest(Op.READ, S("zz"), 0, S("b"), 0, 10),
        TransferRequest(Op.WRITE, S("a"), 200, S("b"), 200, 100),
    ]
    res = a.wait(a.submit(reqs), 10)
    kinds = [r.error_type for r in res.results]
    assert kinds == [
        None,
        "UnknownSegment",
        "OutOfRange",
        "InvalidRequest",
        "InvalidRequest",
        "OutOfRange",
        "UnknownSegment",
        None,
    ]
    assert res.failed == [1, 2, 3, 4, 5, 6]
    assert bytes(target[:100]) == bytes(local[:100])
    assert bytes(target[200:300]) == bytes(local[200:300])
    with pytest.raises(TransferError, match="6 of 8 requests failed"):
        res.raise_for_errors()


def test_many_small_requests_with_status(pair) -> None:  # type: ignore[no-untyped-def]
    a, _b, local, target = pair
    # 64 scattered 4 KB writes (every other block: not coalescable) then reads back.
    reqs = [TransferRequest(Op.WRITE, S("a"), i * 4096, S("b"), i * 8192, 4096) for i in range(64)]
    bid = a.submit(reqs)
    res = a.wait(bid, 10)
    assert res.ok and len(res.results) == 64
    with pytest.raises(UnknownBatch):
        a.status(bid)
    for i in range(64):
        assert bytes(target[i * 8192 : i * 8192 + 4096]) == bytes(local[i * 4096 : (i + 1) * 4096])
    local[:] = bytes(len(local))
    reads = [TransferRequest(Op.READ, S("a"), i * 4096, S("b"), i * 8192, 4096) for i in range(64)]
    bid = a.submit(reads)
    st = a.status(bid)
    assert st.total == 64
    assert a.wait(bid, 10).ok
    assert a.status is not None
    assert all(
        bytes(local[i * 4096 : (i + 1) * 4096]) == bytes(target[i * 8192 : i * 8192 + 4096])
        for i in range(64)
    )


def test_torch_tensor_segment(pair) -> None:  # type: ignore[no-untyped-def]
    """A torch CPU tensor registers through its storage (no copy): writes land in it."""
    import torch  # the engine extra, always installed by make test

    a, _b, _local, target = pair
    t = torch.zeros(4096, dtype=torch.float32)
    a.register_memory("tensor", t)
    target[0:16] = torch.arange(4, dtype=torch.float32).numpy().tobytes()
    a.transfer([TransferRequest(Op.READ, "tensor", 64, "b", 0, 16)]).raise_for_errors()
    assert t[16:20].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(InvalidRequest):
        a.register_memory("grad", torch.zeros(4, requires_grad=True))
    a.unregister("tensor")


def test_unregistered_buffers_and_numpy(pair) -> None:  # type: ignore[no-untyped-def]
    a, _b, _local, target = pair
    data = np.arange(10_000, dtype=np.float32)
    a.write("b", 123, data)  # read-only-ish source is fine
    assert bytes(target[123 : 123 + data.nbytes]) == data.tobytes()
    out = np.zeros(10_000, dtype=np.float32)
    a.read_into("b", 123, out)
    assert np.array_equal(out, data)
    a.write("b", 0, b"immutable bytes")
    with pytest.raises(InvalidRequest):
        a.read_into("b", 0, b"not writable")
    with pytest.raises(OutOfRange):
        a.read_into("b", (2 << 20) - 4, bytearray(8))
    with pytest.raises(UnknownSegment):
        a.write("missing", 0, b"x")


def test_wait_unknown_batch_and_empty_batch(pair) -> None:  # type: ignore[no-untyped-def]
    a, *_ = pair
    with pytest.raises(UnknownBatch):
        a.wait(BatchId(999_999))
    assert a.wait(a.submit([])).ok


def test_concurrent_submitters(pair) -> None:  # type: ignore[no-untyped-def]
    a, _b, local, target = pair
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for _ in range(5):
                off = k * 65536
                r = [TransferRequest(Op.WRITE, S("a"), off, S("b"), off, 65536)]
                a.wait(a.submit(r), 10).raise_for_errors()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert bytes(target[: 8 * 65536]) == bytes(local[: 8 * 65536])


def test_registration_rules(make_engine: EngineFactory) -> None:
    a = make_engine()
    b = make_engine()
    buf = bytearray(100)
    info = a.register_memory("x", buf)
    assert info.size == 100 and not info.shm_backed and info.owner == a.owner
    with pytest.raises(SegmentExists):
        a.register_memory("x", bytearray(10))
    with pytest.raises(SegmentExists):  # the directory refuses another owner
        b.register_memory("x", bytearray(10))
    with pytest.raises(InvalidRequest):
        a.register_memory("ro", b"read-only")
    with pytest.raises(InvalidRequest):
        a.register_memory("empty", bytearray())
    mv = a.allocate_segment("s", 8192)
    assert b.segment_info("s").shm_backed and b.segment_info("s").size == 8192
    assert mv.nbytes == 8192
    a.unregister("x")
    with pytest.raises(UnknownSegment):
        b.segment_info("x")
    with pytest.raises(UnknownSegment):
        a.unregister("x")
    a.close()
    a.close()  # idempotent
    with pytest.raises(UnknownSegment):  # close unpublished everything
        b.segment_info("s")
    with pytest.raises(TransferError):
        a.register_memory("y", bytearray(1))
