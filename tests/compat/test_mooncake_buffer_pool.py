"""kvcake's BufferPool follows the 0.3.13 wheel (Mooncake's test_buffer_pool_native.py passes
16/16 on it). Requests that can never be served fail at once (Mooncake's own
test_buffer_pool_native.py: ``acquire((1 << 64) - 1)`` raises RuntimeError "overflow|capacity"
on the 0.3.13 wheel; kvcake's pool used to wait for ever)."""

from __future__ import annotations

import pytest

from kvcake.compat.mooncake._buffer_pool import BufferPool


@pytest.mark.parametrize("max_bytes", [1024 * 1024, 0])
def test_unservable_size_raises_instead_of_blocking(max_bytes: int) -> None:
    pool = BufferPool(None, max_bytes, min_size_class=4096, alignment=4096)
    with pytest.raises(RuntimeError, match="overflow|capacity"):
        pool.acquire((1 << 64) - 1)
    lease = pool.acquire(4096)  # the pool still serves
    assert lease.size == 4096
    lease.release()
    pool.close()


def test_release_refuses_while_any_view_is_alive() -> None:
    """A recycled region written through a stale view would corrupt the next lease: an alias,
    a slice or a numpy array over ``lease.buffer`` each block ``release()`` (the wheel's rule)."""
    import numpy as np

    pool = BufferPool(None, min_size_class=4096, alignment=4096)
    lease = pool.acquire(100)
    for make in (lambda b: b, lambda b: b[10:20], lambda b: np.frombuffer(b, dtype=np.uint8)):
        held = make(lease.buffer)
        with pytest.raises(RuntimeError, match="exported views"):
            lease.release()
        del held
    with pytest.raises(RuntimeError, match="active leases"):
        pool.close()
    lease.release()
    lease.release()  # a second release is a no-op
    with pytest.raises(RuntimeError, match="released"):
        _ = lease.buffer
    pool.close()


def test_a_released_view_does_not_block_release() -> None:
    """The wheel lets a lease go once its views are released (``view.release()``), not only
    collected: its structured_object_store does ``view = lease.buffer; ...; view.release()``
    and later ``lease.release()`` (Mooncake's test_structured_object_store.py,
    ``..._zero_copy_uses_real_buffer_pool``). kvcake counted references to the view's managed
    buffer, which a released view keeps, so the release raised. Each step below is what the
    0.3.13 wheel answered to the same calls (probe of 2026-12-02)."""
    pool = BufferPool(None, min_size_class=4096, alignment=4096)
    lease = pool.acquire(100)
    view = lease.buffer
    view[:3] = b"abc"
    view.release()
    lease.release()  # the released view is still referenced here, and does not count

    lease = pool.acquire(100)
    view = lease.buffer
    piece = view[1:3]
    view.release()
    with pytest.raises(RuntimeError, match="exported views"):
        lease.release()  # a live slice of a released view still counts
    piece.release()
    lease.release()

    lease = pool.acquire(100)
    view = lease.buffer
    alias = memoryview(view)
    alias.release()
    with pytest.raises(RuntimeError, match="exported views"):
        lease.release()  # the view itself is alive
    view.release()
    lease.release()
    pool.close()


def test_sizes_no_class_serves_get_a_dedicated_region() -> None:
    pool = BufferPool(None, 64 * 1024, min_size_class=4096, max_size_class=8192, alignment=4096)
    for size in (0, 8193, 1 << 20):  # 0 from the smallest class; the others dedicated
        with pool.acquire(size) as lease:
            assert lease.size == len(lease.buffer) == size
    assert pool._mapped == 4096  # dedicated regions are not kept nor counted against the cap
    pool.close()


def test_exhaustion_and_bad_configuration_raise_runtime_errors() -> None:
    with pytest.raises(RuntimeError, match="power of two"):
        BufferPool(None, alignment=12345)
    pool = BufferPool(
        None, min_size_class=4096, max_size_class=4096, alignment=4096, max_regions=1
    )  # fmt: skip
    lease = pool.acquire(1)
    with pytest.raises(RuntimeError, match="exhausted") as exc:
        pool.acquire(1, block=False)
    assert isinstance(exc.value, MemoryError)  # what kvcake raised before the wheel's rule
    with pytest.raises(RuntimeError, match="timed out") as late:
        pool.acquire(1, timeout=0.05)
    assert isinstance(late.value, TimeoutError)
    lease.release()
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.acquire(1)
