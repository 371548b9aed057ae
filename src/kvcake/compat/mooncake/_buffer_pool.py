"""``mooncake.store.BufferPool`` (= ``RegisteredBufferPool``): leases on registered host memory
for the zero-copy calls, with the 0.3.13 wheel's observable behaviour (measured with its own
``test_buffer_pool_native.py`` and a probe of the wheel, docs/compat/mooncake.md):

- sizes round up to power-of-two classes from ``min_size_class`` to ``max_size_class``; each
  class region is an anonymous mapping registered with the store and reused after release;
- a size no class serves (0 is served by the smallest class; above ``max_size_class`` or the
  ``max_bytes`` cap) gets a dedicated mapping, unmapped when released; a size above physical
  memory raises RuntimeError ("exceeds capacity") instead of waiting for ever;
- an exhausted pool blocks (up to ``timeout``) or raises; every pool error is a RuntimeError,
  as the wheel's are (they also derive from MemoryError / TimeoutError, what kvcake raised first);
- ``lease.buffer`` is a fresh memoryview each time; ``release()`` refuses while any view of it
  (an alias, a slice, a numpy array over it) is alive and not released (``view.release()``
  frees it, as on the wheel), and so does ``close()`` while leases are out: a recycled region
  must never be written through a stale view.
"""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

_PHYS = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class PoolExhausted(RuntimeError, MemoryError):
    """No region is free and the pool may map no more (``block_on_exhaustion=False``)."""


class PoolTimeout(TimeoutError, RuntimeError):
    """No region came free within ``timeout``."""


class _Region:
    """One registered mapping; ``cls`` 0 marks a dedicated (non-recycled) one."""

    __slots__ = ("cls", "m", "ptr")

    def __init__(self, m: mmap.mmap, ptr: int, cls: int):
        self.m, self.ptr, self.cls = m, ptr, cls


def _exports_reader() -> Callable[[object], int] | None:
    """CPython's managed buffer (``_PyManagedBufferObject``: the object header, ``int flags``,
    ``Py_ssize_t exports``) counts the memoryviews registered on it that are neither released
    nor collected, which is exactly "views still alive". Checked once on a probe; ``None`` when
    this interpreter lays it out otherwise."""
    offset = object.__basicsize__ + ctypes.sizeof(ctypes.c_ssize_t)  # int flags, padded

    def read(mbuf: object) -> int:
        return ctypes.c_ssize_t.from_address(id(mbuf) + offset).value

    try:
        base = memoryview(bytearray(8))
        (mbuf,) = gc.get_referents(base)
        if type(mbuf).__name__ != "managedbuffer" or read(mbuf) != 1:
            return None
        view = base[2:4]
        alive = read(mbuf)
        view.release()
        return read if (alive, read(mbuf)) == (2, 1) else None
    except (ValueError, TypeError):
        return None


_LIVE_VIEWS = _exports_reader()


def _views(mbuf: object) -> int:
    """Views of a lease's managed buffer that still count: the live ones (a released view does
    not, as on the wheel). Without the exports count, references to the managed buffer (every
    view derived from the lease's holds one, released or not) stand in for it."""
    return _LIVE_VIEWS(mbuf) if _LIVE_VIEWS is not None else sys.getrefcount(mbuf)


class BufferLease:
    """A region of the pool: ``ptr``, ``size``, ``buffer`` (a new memoryview per access);
    ``release()`` gives it back (also on ``with`` exit and, as a last resort, when collected)."""

    def __init__(self, pool: BufferPool, region: _Region, size: int):
        self._pool: BufferPool | None = pool
        self._region = region
        self.ptr, self.size = region.ptr, size
        self._base = memoryview(region.m)[:size]  # its own managed buffer: see _views
        (self._mbuf,) = gc.get_referents(self._base)
        self._idle = _views(self._mbuf)

    @property
    def buffer(self) -> memoryview:
        if self._pool is None:
            raise RuntimeError("buffer lease is released")
        return self._base[:]

    def _exported(self) -> bool:
        return _views(self._mbuf) > self._idle

    def release(self) -> None:
        if self._pool is None:
            return
        if self._exported():
            raise RuntimeError("cannot release buffer while exported views exist")
        pool, self._pool = self._pool, None
        self._base.release()
        pool._give_back(self._region)

    def __enter__(self) -> BufferLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        if self._pool is not None and not self._exported():
            self.release()


class BufferPool:
    """Invariant (under ``_cond``): ``_mapped`` is the bytes of class regions mapped, leased or
    free; ``_leased`` counts leases not yet released (dedicated regions included)."""

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
        if alignment < ctypes.sizeof(ctypes.c_void_p) or alignment & (alignment - 1):
            raise RuntimeError("alignment must be a power of two and at least sizeof(void*)")
        if min_size_class <= 0 or max_bytes < 0:
            raise RuntimeError("min_size_class must be > 0 and max_bytes >= 0")
        self._store, self.max_bytes = store, max_bytes
        self.min_size_class, self.max_size_class = min_size_class, max_size_class
        self.block_on_exhaustion, self.default_timeout = block_on_exhaustion, default_timeout
        self.max_regions = max_regions
        self._free: dict[int, list[_Region]] = {}
        self._maps: list[_Region] = []
        self._mapped = self._leased = 0
        self._cond = threading.Condition()
        self._closed = False
        if prewarm_size and prewarm_count:
            self.prewarm(prewarm_size, prewarm_count)

    def _class_of(self, size: int) -> int:
        """The size class serving ``size``; 0: none does (a dedicated region)."""
        if size < 0:
            raise RuntimeError(f"size {size} must be >= 0")
        if size > _PHYS:
            raise RuntimeError(f"size {size} overflows the host's capacity ({_PHYS} bytes)")
        cls = self.min_size_class
        while cls < size:
            cls *= 2
        too_big = self.max_size_class is not None and cls > self.max_size_class
        return 0 if too_big or (self.max_bytes and cls > self.max_bytes) else cls

    def _can_map(self, cls: int) -> bool:
        if self.max_bytes and self._mapped + cls > self.max_bytes:
            return False
        return self.max_regions is None or len(self._maps) < self.max_regions

    def _map(self, nbytes: int, cls: int) -> _Region:
        m = mmap.mmap(-1, nbytes)
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        rc = self._store.register_buffer(ptr, nbytes) if self._store is not None else 0
        if rc != 0:
            m.close()
            raise RuntimeError(f"register_buffer failed: {rc}")
        region = _Region(m, ptr, cls)
        if cls:
            self._maps.append(region)
            self._mapped += cls
        return region

    def _unmap(self, region: _Region) -> None:
        if self._store is not None:
            self._store.unregister_buffer(region.ptr)
        region.m.close()

    def prewarm(self, size: int, count: int) -> None:
        cls = self._class_of(size)
        with self._cond:
            for _ in range(count if cls else 0):
                if not self._can_map(cls):
                    break
                self._free.setdefault(cls, []).append(self._map(cls, cls))

    def acquire(
        self, size: int, block: bool | None = None, timeout: float | None = None
    ) -> BufferLease:
        cls = self._class_of(size)
        block = self.block_on_exhaustion if block is None else block
        timeout = self.default_timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                region = self._take(cls, size)
                if region is not None:
                    self._leased += 1
                    return BufferLease(self, region, size)
                if not block:
                    raise PoolExhausted(f"buffer pool is exhausted ({self._mapped} bytes mapped)")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise PoolTimeout(f"timed out waiting for buffer ({cls} bytes, {timeout}s)")
                self._cond.wait(left)

    buffer = acquire

    def _take(self, cls: int, size: int) -> _Region | None:
        if self._closed:
            raise RuntimeError("buffer pool is closed")
        if not cls:
            return self._map(max(size, 1), 0)
        free = self._free.get(cls)
        if free:
            return free.pop()
        return self._map(cls, cls) if self._can_map(cls) else None

    def _give_back(self, region: _Region) -> None:
        with self._cond:
            self._leased -= 1
            if not region.cls:
                self._unmap(region)
            elif not self._closed:
                self._free.setdefault(region.cls, []).append(region)
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            if self._leased:
                raise RuntimeError(f"cannot close buffer pool with active leases ({self._leased})")
            self._closed = True
            self._cond.notify_all()
            for region in self._maps:
                self._unmap(region)
            self._maps.clear()
            self._free.clear()
            self._mapped = 0


RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease
