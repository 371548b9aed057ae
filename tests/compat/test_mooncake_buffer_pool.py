"""BufferPool requests that can never be served fail at once (Mooncake's own
test_buffer_pool_native.py: ``acquire((1 << 64) - 1)`` raises RuntimeError "overflow|capacity"
on the 0.3.13 wheel; kvcake's pool used to wait for ever)."""

from __future__ import annotations

import pytest

from kvcake.compat.mooncake._buffers import BufferPool


@pytest.mark.parametrize("max_bytes", [1024 * 1024, 0])
def test_unservable_size_raises_instead_of_blocking(max_bytes: int) -> None:
    pool = BufferPool(None, max_bytes, min_size_class=4096, alignment=4096)
    with pytest.raises(RuntimeError, match="overflow|capacity"):
        pool.acquire((1 << 64) - 1)
    lease = pool.acquire(4096)  # the pool still serves
    assert lease.size == 4096
    lease.release()
    pool.close()
