"""The store as the structured layer sees it: any object with Mooncake's store methods (a
``MooncakeDistributedStore`` or a test double). Optional methods are found by name and used when
callable; statuses are checked; buffers are registered for the duration of one transfer."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

MISSING = -704  # remove of an object that is already gone: nothing left to clean
ALREADY_REGISTERED = -600  # register_buffer of a buffer the caller registered itself


def check(status: Any, op: str, key: str) -> None:
    if status not in (None, 0):
        raise RuntimeError(f"{op} failed for {key}: {status}")


def address(buf: Any) -> int:
    """The address of a writable buffer (bytearray, ndarray, writable memoryview)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def with_config(fn: Callable[..., Any], *args: Any, config: Any = None) -> Any:
    """Mooncake's write calls take ``config`` only when one is given (test doubles and older
    stores have no such parameter)."""
    return fn(*args) if config is None else fn(*args, config=config)


class Port:
    def __init__(self, store: Any) -> None:
        self.store = store

    def fn(self, name: str) -> Callable[..., Any] | None:
        f = getattr(self.store, name, None)
        return f if callable(f) else None

    @property
    def can_register(self) -> bool:
        return self.fn("register_buffer") is not None and self.fn("unregister_buffer") is not None

    def put(self, key: str, value: Any, config: Any = None) -> None:
        check(with_config(self.store.put, key, value, config=config), "put", key)

    def get(self, key: str, size: int) -> bytes:
        data = self.store.get(key)
        if len(data) != size:
            raise RuntimeError(f"get failed for {key}: expected {size} bytes, got {len(data)}")
        return data

    @contextmanager
    def registered(self, regions: Sequence[tuple[int, int]], label: str) -> Iterator[None]:
        """Registers each ``(ptr, size)`` for the block; a buffer the caller already registered
        (-600) is used as it is and left registered."""
        register, done, ok = self.fn("register_buffer"), [], False
        if register is None or self.fn("unregister_buffer") is None:
            raise RuntimeError(f"register_buffer APIs are unavailable for {label}")
        try:
            for ptr, size in regions:
                if size == 0:
                    continue
                status = register(ptr, size)
                if status == 0:
                    done.append(ptr)
                elif status != ALREADY_REGISTERED:
                    raise RuntimeError(f"register_buffer failed for {label}: {status}")
            yield
            ok = True
        finally:
            self._unregister(done, label, strict=ok)

    def _unregister(self, ptrs: list[int], label: str, strict: bool) -> None:
        unregister = self.store.unregister_buffer
        for ptr in reversed(ptrs):
            try:
                check(unregister(ptr), "unregister_buffer", label)
            except Exception:
                if strict:
                    raise

    def remove_keys(self, keys: Sequence[str], *, strict: bool) -> None:
        """Removes ``keys`` (forced; gone already is fine): one ``batch_remove`` when the store
        has it, then ``remove`` for any key the batch did not take."""
        pending = list(dict.fromkeys(keys))
        batch = self.fn("batch_remove")
        if batch is not None and pending:
            try:
                pending = self._batch_remove(batch, pending)
            except Exception:
                if strict:
                    raise
        failed = []
        for key in pending:
            try:
                status = self.store.remove(key, True)
            except KeyError:
                continue
            except Exception:
                if strict:
                    raise
                continue
            if status not in (None, 0, MISSING):
                failed.append((key, status))
        if failed and strict:
            raise RuntimeError(f"failed to remove {len(failed)} Mooncake keys: {failed[:3]}")

    @staticmethod
    def _batch_remove(batch: Callable[..., Any], keys: list[str]) -> list[str]:
        try:
            results = batch(keys, True)
        except TypeError:
            results = batch(keys)
        if len(results) != len(keys):
            raise RuntimeError(f"batch_remove returned {len(results)} results for {len(keys)} keys")
        return [k for k, s in zip(keys, results, strict=True) if s not in (None, 0, MISSING)]
