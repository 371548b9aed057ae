"""Host-memory helpers of ``mooncake.store`` (its ``BufferPool`` is in ``_buffer_pool``):
``MooncakeHostMemAllocator``, ``get_alloc_func_addr`` / ``get_free_func_addr`` (libc's
malloc/free) and ``bind_to_numa_node``."""

from __future__ import annotations

import ctypes
import os

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


RegisteredBufferLeaseView = BufferLeaseView
