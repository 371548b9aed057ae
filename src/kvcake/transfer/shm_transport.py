"""Same-host transport: copy through a mapping of the target's memory, no server hop.

Used when the target segment belongs to this engine (its view is at hand) or is a ``/dev/shm``
file of a process on this host. Peers' files are mapped on first use and kept in an LRU of at
most ``max_maps`` mappings. Each mapping carries a liveness fd of the owning process (a pidfd,
polled without blocking, ~1 µs): a copy that finishes after the owner died is reported as
:class:`OwnerGone` and the mapping is dropped at once, so readers never keep reading memory a
dead process left behind (its directory entry may outlive it until the owner's master drops it).
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kvcake.core import native
from kvcake.transfer import shm
from kvcake.transfer.batch import Batch, Job, Slice, cut
from kvcake.transfer.errors import OwnerGone, TransferError
from kvcake.transfer.segments import SegmentTable
from kvcake.transfer.transport import Task, Transport
from kvcake.transfer.types import Landed, Op, SegmentInfo


def owner_pid(owner: str) -> int | None:
    """The pid in an engine's owner id (``host/pid/token``), if it has one."""
    parts = owner.split("/")
    if len(parts) >= 3 and parts[-2].isdigit():
        return int(parts[-2])
    return None


class Liveness:
    """Is the process ``pid`` alive? A pidfd becomes readable when the process exits."""

    def __init__(self, pid: int | None):
        self.pid = pid
        self._dead = False
        self._fd = -1
        self._poll: select.poll | None = None
        self._poll_lock = threading.Lock()
        if pid is None:
            return
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._dead = True
            return
        except (OSError, AttributeError):  # no pidfds here: fall back to kill(pid, 0)
            return
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)

    def alive(self) -> bool:
        if self._dead or self.pid is None:
            return not self._dead  # (no pid: nothing to watch, taken as alive)
        if self._poll is not None:
            with self._poll_lock:  # a poll object refuses concurrent poll() calls
                if self._poll.poll(0):
                    self._dead = True
        else:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self._dead = True
            except PermissionError:
                pass
        return not self._dead

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


@dataclass(eq=False)
class PeerMap:
    mm: mmap.mmap
    view: memoryview
    live: Liveness

    def close(self) -> None:
        self.live.close()
        with contextlib.suppress(BufferError, ValueError):
            self.view.release()
        with contextlib.suppress(BufferError, ValueError):
            self.mm.close()  # views still in use keep the pages until they are dropped


class ShmTransport(Transport):
    name = "shm"

    def __init__(
        self,
        owner: str,
        host_id: str,
        segments: SegmentTable,
        max_maps: int = 64,
        on_gone: Callable[[str], None] = lambda _n: None,
    ):
        self._owner = owner
        self._host_id = host_id
        self._segments = segments
        self._max_maps = max_maps
        self._on_gone = on_gone
        self._lock = threading.Lock()
        self._maps: collections.OrderedDict[str, PeerMap] = collections.OrderedDict()

    def usable(self, target: SegmentInfo) -> bool:
        if target.owner == self._owner and target.name in self._segments:
            return True
        return (
            target.shm_path is not None
            and target.host_id == self._host_id
            and os.path.exists(target.shm_path)
        )

    def _peer(self, target: SegmentInfo) -> PeerMap:
        path = target.shm_path
        assert path is not None
        with self._lock:
            pm = self._maps.get(path)
            if pm is not None:
                self._maps.move_to_end(path)
                return pm
        live = Liveness(owner_pid(target.owner))
        if not live.alive() or not shm.owner_holds_lock(path):
            live.close()
            raise self._gone(target)
        mm = shm.map_peer(path, target.size)
        pm = PeerMap(mm, memoryview(mm), live)
        evicted: list[PeerMap] = []
        with self._lock:
            first = self._maps.get(path)
            if first is None:
                self._maps[path] = pm
                while len(self._maps) > self._max_maps:
                    evicted.append(self._maps.popitem(last=False)[1])
        if first is not None:  # another thread mapped it meanwhile and may be copying through it
            pm.close()
            return first
        for m in evicted:
            m.close()
        return pm

    def _gone(self, target: SegmentInfo) -> OwnerGone:
        """Forget everything about a dead owner's segment; the error to report."""
        if target.shm_path is not None:
            self.forget(target.shm_path)
        self._on_gone(target.name)
        return OwnerGone(
            f"segment {target.name!r}: its owner {target.owner} has exited; "
            "its shared memory is no longer used"
        )

    def span(
        self, target: SegmentInfo, offset: int, n: int
    ) -> tuple[memoryview, Callable[[], None]]:
        """``target``'s bytes ``[offset, offset + n)`` as a view of this process's mapping, and
        the check to call once done copying through it: it raises OwnerGone when the owner died
        meanwhile (bytes read then must not be handed out; bytes written are lost)."""
        if target.owner == self._owner and target.name in self._segments:
            span = self._segments.get(target.name).view[offset : offset + n]
            live = None
        else:
            pm = self._peer(target)
            span = pm.view[offset : offset + n]
            live = pm.live
        if span.nbytes != n:
            raise TransferError("target range beyond the mapped segment")

        def check() -> None:
            if live is not None and not live.alive():
                raise self._gone(target)

        return span, check

    def _copy(self, op: Op, local: memoryview, target: SegmentInfo, offset: int) -> None:
        span, check = self.span(target, offset, local.nbytes)
        if op is Op.WRITE:  # into a segment nobody here reads soon: streamed (core.native)
            native.copy(span, local)
        else:  # the reader uses what it read: into its cache
            native.copy(local, span, stream=False)
        check()  # after the copy: bytes read while (or after) the owner died are not handed out

    def tasks(self, batch: Batch, jobs: list[Job]) -> list[Task]:
        slices = [s for j in jobs for s in cut(j, max(j.length, 1))]
        return [lambda: self._run(batch, slices)]

    def run_single(
        self,
        op: Op,
        local: memoryview,
        target: SegmentInfo,
        offset: int,
        landed: Landed | None = None,
        fence: int = 0,
    ) -> bool:
        """One copy in the caller's thread (no batch, task or thread hand-off). Raises
        OwnerGone for a dead owner; False when it cannot be done here otherwise (the general
        path then reports the error)."""
        try:
            self._copy(op, local, target, offset)
        except OwnerGone:
            raise
        except (OSError, ValueError, TransferError):
            return False
        return True

    def _run(self, batch: Batch, slices: list[Slice]) -> None:
        for s in slices:
            try:
                self._copy(s.job.op, s.local, s.job.target, s.target_offset)
            except Exception as exc:
                batch.slice_done(s, exc)
            else:
                batch.slice_done(s)

    def mapped(self) -> list[str]:
        """Paths of the peers' files mapped now (most recently used last)."""
        with self._lock:
            return list(self._maps)

    def forget(self, shm_path: str) -> None:
        with self._lock:
            pm = self._maps.pop(shm_path, None)
        if pm is not None:
            pm.close()

    def close(self) -> None:
        with self._lock:
            maps, self._maps = list(self._maps.values()), collections.OrderedDict()
        for pm in maps:
            pm.close()
