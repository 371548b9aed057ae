"""kvcake's ``mooncake.async_store``: :class:`MooncakeDistributedStoreAsync`, the store whose
every method ``m`` has an awaitable twin ``async_m`` that runs ``m`` on the event loop's default
executor (a thread), as the wheel's module offers. The calls themselves are the sync store's."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from kvcake.compat.mooncake.store import MooncakeDistributedStore

PREFIX = "async_"


class MooncakeDistributedStoreAsync(MooncakeDistributedStore):
    def __getattr__(self, name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        # Only reached for names the class does not have: async_<method> is made once, then
        # cached on the instance; anything else is the usual AttributeError.
        if not name.startswith(PREFIX):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        sync = getattr(self, name[len(PREFIX) :], None)
        if sync is None or not callable(sync):
            raise AttributeError(
                f"'{type(self).__name__}' object has no attribute '{name}' "
                f"(no method '{name[len(PREFIX) :]}')"
            )
        wrapper = _awaitable(sync)
        object.__setattr__(self, name, wrapper)
        return wrapper


def _awaitable(sync: Callable[..., Any]) -> Callable[..., Coroutine[Any, Any, Any]]:
    @functools.wraps(sync)
    async def call(*args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(sync, *args, **kwargs))

    return call


__kvcake__ = True
__all__ = ["MooncakeDistributedStoreAsync"]
