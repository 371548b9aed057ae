"""Shared memory between a dummy client and the real client: ``/dev/shm`` files the dummy creates
and maps at a raw address (``alloc_from_mem_pool`` hands that address to Python code, as
Mooncake's does), and the real client maps by name. The name lives only until the real client
has mapped it (the dummy unlinks it then), so a crash of either side leaves no file behind."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import itertools
import mmap
import os
import secrets
import stat

from kvcake.compat.mooncake._dummy_wire import SHM_DIR, SHM_NAME
from kvcake.store import errors as E

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
)  # fmt: skip
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MAP_FAILED = ctypes.c_void_p(-1).value
_TOKEN = secrets.token_hex(8)
_COUNTER = itertools.count()


def create(size: int) -> tuple[str, int]:
    """A new shared-memory file of ``size`` bytes mapped in this process: (name, address)."""
    name = f"kvcake-dummy-{os.getpid()}-{_TOKEN}-{next(_COUNTER)}"
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
        addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {size} bytes: {os.strerror(err)}")
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return name, int(addr)


def unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(SHM_DIR, name))


def unmap(addr: int, size: int) -> None:
    _libc.munmap(addr, size)


def open_map(name: str, size: int) -> mmap.mmap:
    """The real client's side: map the dummy's file ``name`` (exactly ``size`` bytes). Names
    outside kvcake's pattern, links and files of another size are refused (InvalidParams)."""
    if not SHM_NAME.fullmatch(name) or size <= 0:
        raise E.InvalidParams(f"not a dummy-client segment: {name!r} ({size} bytes)")
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_NOFOLLOW)
    except OSError as exc:
        raise E.InvalidParams(f"cannot open {name}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            raise E.InvalidParams(f"{name}: {st.st_size} bytes, the dummy said {size}")
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


class Segments:
    """The dummy's ``alloc_from_mem_pool`` blocks (id -> address, size) and which of them are
    registered (``register_buffer``); segment 0, the local buffer, is never a user's buffer."""

    def __init__(self) -> None:
        self._blocks: dict[int, tuple[int, int]] = {}
        self.registered: set[int] = set()

    def add(self, seg: int, addr: int, size: int) -> None:
        self._blocks[seg] = (addr, size)

    def at(self, addr: int) -> tuple[int, int] | None:
        """(segment id, size) of the block starting exactly at ``addr``."""
        return next(((s, n) for s, (a, n) in self._blocks.items() if a == addr and s), None)

    def find(self, addr: int, size: int) -> tuple[int, int, int] | None:
        """(segment, offset, size) when ``addr`` .. ``addr + size`` lies in a registered block."""
        for seg, (base, n) in self._blocks.items():
            if seg in self.registered and base <= addr and addr + size <= base + n:
                return (seg, addr - base, size)
        return None
