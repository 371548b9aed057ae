"""An in-memory store with the Mooncake store methods the structured layer uses, counting calls
and tracking registered buffers (a real implementation of the interface, for fast tests)."""

from __future__ import annotations

import ctypes
import threading
import time
from collections import Counter
from typing import Any


class MemStore:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.objects: dict[str, bytes] = {}
        self.registered: dict[int, int] = {}
        self.calls: Counter[str] = Counter()
        self.delay_s = delay_s
        self._lock = threading.Lock()
        self.active = self.max_active = 0

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] += 1

    def _enter(self) -> None:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        time.sleep(self.delay_s)

    def _leave(self) -> None:
        with self._lock:
            self.active -= 1

    def put(self, key: str, value: Any) -> int:
        self._count("put")
        self._enter()
        try:
            self.objects[key] = bytes(value)
        finally:
            self._leave()
        return 0

    def get(self, key: str) -> bytes:
        self._count("get")
        return self.objects.get(key, b"")

    def is_exist(self, key: str) -> int:
        return int(key in self.objects)

    def remove(self, key: str, force: bool = False) -> int:
        self._count("remove")
        return 0 if self.objects.pop(key, None) is not None else -704

    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]:
        self._count("batch_remove")
        return [0 if self.objects.pop(k, None) is not None else -704 for k in keys]

    def register_buffer(self, ptr: int, size: int) -> int:
        self._count("register_buffer")
        if ptr in self.registered:
            return -600
        self.registered[ptr] = size
        return 0

    def unregister_buffer(self, ptr: int) -> int:
        self._count("unregister_buffer")
        return 0 if self.registered.pop(ptr, None) is not None else -600

    def _check(self, ptr: int, size: int) -> bool:
        return any(p <= ptr and ptr + size <= p + n for p, n in self.registered.items())

    def batch_put_from(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        self._count("batch_put_from")
        out = []
        for key, ptr, size in zip(keys, ptrs, sizes, strict=True):
            out.append(
                self.put(key, ctypes.string_at(ptr, size)) if self._check(ptr, size) else -600
            )
        return out

    def batch_get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        self._count("batch_get_into")
        return [self._into(k, p, n) for k, p, n in zip(keys, ptrs, sizes, strict=True)]

    def get_into(self, key: str, ptr: int, size: int) -> int:
        self._count("get_into")
        return self._into(key, ptr, size)

    def _into(self, key: str, ptr: int, size: int) -> int:
        data = self.objects.get(key)
        if data is None:
            return -704
        if len(data) > size or not self._check(ptr, size):
            return -600
        ctypes.memmove(ptr, data, len(data))
        return len(data)

    def get_into_ranges(
        self, ptrs: list[int], keys: list[list[str]], dst: Any, src: Any, sizes: Any
    ) -> list[list[list[int]]]:
        self._count("get_into_ranges")
        out = []
        for ptr, ks, ds, ss, ns in zip(ptrs, keys, dst, src, sizes, strict=True):
            per_key = []
            for key, d, s, n in zip(ks, ds, ss, ns, strict=True):
                data = self.objects[key]
                per_key.append([self._range(ptr, data, *r) for r in zip(d, s, n, strict=True)])
            out.append(per_key)
        return out

    def _range(self, ptr: int, data: bytes, dst: int, src: int, size: int) -> int:
        if src + size > len(data) or not self._check(ptr + dst, size):
            return -600
        ctypes.memmove(ptr + dst, data[src : src + size], size)
        return size
