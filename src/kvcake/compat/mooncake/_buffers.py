"""Local-buffer pools and host-memory helpers of ``mooncake.store``: ``BufferPool`` (=
``RegisteredBufferPool``) hands out leases on registered, size-classed regions for the
zero-copy calls; ``MooncakeHostMemAllocator``, ``get_alloc_func_addr`` / ``get_free_func_addr``
(libc's malloc/free) and ``bind_to_numa_node``."""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time
from typing import Any

_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]


def get_alloc_func_addr() -> int:
    return ctypes.cast(_libc.malloc, ctypes.c_void_p).value or 0


def get_free_func_addr() -> int:
    return ctypes.cast(_libc.free, ctypes.c_void_p).value or 0


class MooncakeHostMemAllocator:
    """malloc/free of host memory by integer address."""

    def __init__(self) -> None:
        self._live: set[int] = set()

    def alloc(self, size: int) -> int:
        ptr = _libc.malloc(size) if size > 0 else 0
        if ptr:
            self._live.add(ptr)
        return int(ptr or 0)

    def free(self, ptr: int) -> int:
        if ptr not in self._live:
            return -1
        self._live.discard(ptr)
        _libc.free(ptr)
        return 0


def bind_to_numa_node(node: int) -> None:
    """Pin the calling thread to the CPUs of NUMA node ``node``."""
    try:
        with open(f"/sys/devices/system/node/node{int(node)}/cpulist") as fh:
            spec = fh.read().strip()
    except OSError as exc:
        raise RuntimeError(f"NUMA node {node} not found") from exc
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    os.sched_setaffinity(0, cpus)


class BufferLeaseView:
    def __init__(self, mv: memoryview):
        self.buffer = mv


class BufferLease:
    """A region of the pool: ``ptr``, ``size``, ``buffer`` (a memoryview); ``release()`` gives it
    back (also on ``with`` exit and, as a last resort, when the lease is collected)."""

    def __init__(self, pool: BufferPool, region: memoryview, ptr: int, size: int, cls: int):
        self._pool: BufferPool | None = pool
        self._region, self._cls = region, cls
        self.ptr, self.size = ptr, size
        self.buffer = region[:size]

    def release(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool._give_back(self._cls, self._region, self.ptr)

    def __enter__(self) -> BufferLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


class BufferPool:
    """Size classes are powers of two from ``min_size_class`` up to ``max_size_class``; each
    region is an anonymous mapping registered with ``store`` (``register_buffer``). At most
    ``max_bytes`` (0 = no cap) are mapped; an exhausted pool blocks (up to ``timeout``, then
    TimeoutError) or, with ``block_on_exhaustion=False``, raises MemoryError."""

    def __init__(
        self,
        store: Any,
        max_bytes: int = 0,
        min_size_class: int = 65536,
        max_size_class: int | None = None,
        alignment: int = 8388608,
        block_on_exhaustion: bool = True,
        default_timeout: float | None = None,
        max_regions: int | None = None,
        prewarm_size: int | None = None,
        prewarm_count: int = 0,
    ):
        if min_size_class <= 0 or max_bytes < 0 or alignment <= 0:
            raise ValueError("min_size_class and alignment must be > 0, max_bytes >= 0")
        self._store, self.max_bytes = store, max_bytes
        self.min_size_class, self.max_size_class = min_size_class, max_size_class
        self.block_on_exhaustion, self.default_timeout = block_on_exhaustion, default_timeout
        self.max_regions = max_regions
        self._free: dict[int, list[tuple[memoryview, int]]] = {}
        self._maps: list[mmap.mmap] = []
        self._mapped = 0
        self._cond = threading.Condition()
        self._closed = False
        if prewarm_size and prewarm_count:
            self.prewarm(prewarm_size, prewarm_count)

    def _class_of(self, size: int) -> int:
        if size <= 0:
            raise ValueError("size must be > 0")
        cls = self.min_size_class
        while cls < size:
            cls *= 2
        if self.max_size_class is not None and cls > self.max_size_class:
            raise ValueError(f"size {size} above max_size_class {self.max_size_class}")
        if (self.max_bytes and cls > self.max_bytes) or cls >= 1 << 62:
            # never servable: raise now rather than wait for ever (the wheel: RuntimeError too)
            raise RuntimeError(f"size {size} overflows the pool's capacity ({self.max_bytes})")
        return cls

    def _can_map(self, cls: int) -> bool:
        if self.max_bytes and self._mapped + cls > self.max_bytes:
            return False
        return self.max_regions is None or len(self._maps) < self.max_regions

    def _map(self, cls: int) -> tuple[memoryview, int]:
        m = mmap.mmap(-1, cls)
        mv = memoryview(m)
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        rc = self._store.register_buffer(ptr, cls) if self._store is not None else 0
        if rc != 0:
            mv.release()
            m.close()
            raise RuntimeError(f"register_buffer failed: {rc}")
        self._maps.append(m)
        self._mapped += cls
        return mv, ptr

    def prewarm(self, size: int, count: int) -> None:
        cls = self._class_of(size)
        with self._cond:
            for _ in range(count):
                if not self._can_map(cls):
                    break
                self._free.setdefault(cls, []).append(self._map(cls))

    def acquire(
        self, size: int, block: bool | None = None, timeout: float | None = None
    ) -> BufferLease:
        cls = self._class_of(size)
        block = self.block_on_exhaustion if block is None else block
        timeout = self.default_timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("BufferPool is closed")
                free = self._free.get(cls)
                if free:
                    region, ptr = free.pop()
                    return BufferLease(self, region, ptr, size, cls)
                if self._can_map(cls):
                    region, ptr = self._map(cls)
                    return BufferLease(self, region, ptr, size, cls)
                if not block:
                    raise MemoryError(f"BufferPool exhausted ({self._mapped} bytes mapped)")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no {cls}-byte buffer free within {timeout}s")
                self._cond.wait(left)

    buffer = acquire

    def _give_back(self, cls: int, region: memoryview, ptr: int) -> None:
        with self._cond:
            if not self._closed:
                self._free.setdefault(cls, []).append((region, ptr))
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            for regions in self._free.values():
                for region, ptr in regions:
                    if self._store is not None:
                        self._store.unregister_buffer(ptr)
                    region.release()
            self._free.clear()


RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease
RegisteredBufferLeaseView = BufferLeaseView
