"""``mooncake.async_store``: every method of the store as an awaitable ``async_<name>``, run on
the loop's executor against a real master (the same results as the sync calls)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from kvcake.compat.mooncake.async_store import MooncakeDistributedStoreAsync
from tests.store.conftest import Factory


def test_async_methods_are_the_sync_ones(procs: Factory) -> None:
    master = procs("master", "--port", "0", "--http-port", "0", "--client-ttl-s", "1")
    s = MooncakeDistributedStoreAsync()
    rpc = master.info["rpc"]
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 8 << 20, "tcp", "", rpc) == 0
    threads: list[str] = []

    async def main() -> None:
        assert await s.async_put("a", b"one") == 0
        assert await s.async_put_batch(["b", "c"], [b"two", b"three"]) == 0
        got = await asyncio.gather(s.async_get("a"), s.async_get("b"), s.async_is_exist("z"))
        assert list(got) == [b"one", b"two", 0]
        assert await s.async_get_batch(keys=["c"]) == [b"three"]  # keywords pass through
        assert await s.async_get_size("a") == 3 and await s.async_get_size("z") == -704
        assert await s.async_put("d", b"4") == 0 and await s.async_remove("d") == 0  # unread
        threads.append(threading.current_thread().name)

    try:
        asyncio.run(main())
        assert s.async_get is s.async_get  # made once, then kept on the instance
        assert s.async_get.__name__ == "get"
        with pytest.raises(AttributeError, match="no attribute 'async_nothing'"):
            _ = s.async_nothing
        with pytest.raises(AttributeError, match="no attribute 'nothing'"):
            _ = s.nothing
    finally:
        s.close()
