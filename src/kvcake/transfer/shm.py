"""``/dev/shm``-backed segment memory, mapping of peers' files, and cleanup of stale files.

Ownership invariant: the creating process holds a shared ``flock`` on its file for as long as the
segment lives. A file whose lock can be taken exclusively has no living owner (the kernel drops
flocks when a process dies, however it dies), so it is stale and may be unlinked. Peers that map
a file take no lock, so mapping never keeps garbage alive and never blocks cleanup.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from kvcake.transfer.errors import TransferError

log = logging.getLogger(__name__)

SHM_DIR = Path(os.environ.get("KVCAKE_SHM_DIR", "/dev/shm"))
PREFIX = "kvcake-seg-"
_NAME_RE = re.compile(rf"^{PREFIX}(\d+)-[0-9a-f]+(?:-.*)?$")
_CREATE_GRACE_S = 30.0
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass
class ShmRegion:
    """One owned shm file, its mapping and the fd that carries the liveness lock."""

    path: Path
    fd: int
    mm: mmap.mmap
    size: int

    def view(self) -> memoryview:
        return memoryview(self.mm)

    def close(self, unlink: bool = True) -> None:
        """Unlink the file and release the mapping; exported views keep the pages alive until
        they are dropped (closing an exported mmap would raise, so that is tolerated)."""
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        with contextlib.suppress(BufferError, ValueError):
            self.mm.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1


def create_region(segment: str, size: int, shm_dir: Path | None = None) -> ShmRegion:
    """Create, size, lock and map a new shm file for ``segment``."""
    if size <= 0:
        raise TransferError(f"segment size must be > 0, got {size}")
    base = shm_dir or SHM_DIR
    tag = _SAFE.sub("_", segment)[:80]
    path = base / f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}-{tag}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    return ShmRegion(path, fd, mm, size)


def map_peer(path: str, size: int) -> mmap.mmap:
    """Map a same-host peer's segment file read/write (the zero-hop shm transport)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        raise TransferError(f"cannot open peer shm file {path}: {exc}") from exc
    try:
        actual = os.fstat(fd).st_size
        if actual < size:
            raise TransferError(f"peer shm file {path} has {actual} bytes, directory says {size}")
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lock_held(fd: int) -> bool:
    """Does some process hold the liveness flock of the file open at ``fd``?"""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def owner_holds_lock(path: str | Path) -> bool:
    """True while the file's creator (or any process it handed the file to) is alive."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        return _lock_held(fd)
    finally:
        os.close(fd)


def is_stale(path: Path) -> bool:
    """True when no process holds the file's liveness lock (its owner is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        if _lock_held(fd):
            return False
        m = _NAME_RE.match(path.name)
        if m is None or not _pid_alive(int(m.group(1))):
            return True
        # Lock-free but its creator lives: either it is being created right now (the lock is
        # taken just after O_EXCL) or the pid was reused. Only age tells them apart.
        return time.time() - os.fstat(fd).st_ctime > _CREATE_GRACE_S
    finally:
        os.close(fd)


def cleanup_stale(shm_dir: Path | None = None, dry_run: bool = False) -> list[Path]:
    """Unlink kvcake shm files left behind by dead processes; return what was (or would be)
    removed. Files of living processes are never touched."""
    base = shm_dir or SHM_DIR
    removed: list[Path] = []
    try:
        entries = sorted(base.iterdir())
    except FileNotFoundError:
        return removed
    for p in entries:
        if not p.name.startswith(PREFIX) or not is_stale(p):
            continue
        if not dry_run:
            try:
                p.unlink()
            except FileNotFoundError:
                continue
            log.info("removed stale shm segment file %s", p)
        removed.append(p)
    return removed
