"""Same-host transport: copy through a mapping of the target's memory, no server hop.

Used when the target segment belongs to this engine (its view is at hand) or is a ``/dev/shm``
file of a process on this host (mapped once, cached by path). One memmove per job.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading

from kvcake.transfer import shm
from kvcake.transfer.batch import Batch, Job, Slice, cut
from kvcake.transfer.segments import SegmentTable
from kvcake.transfer.transport import Task, Transport
from kvcake.transfer.types import Op, SegmentInfo


class ShmTransport(Transport):
    name = "shm"

    def __init__(self, owner: str, host_id: str, segments: SegmentTable):
        self._owner = owner
        self._host_id = host_id
        self._segments = segments
        self._lock = threading.Lock()
        self._maps: dict[str, mmap.mmap] = {}

    def usable(self, target: SegmentInfo) -> bool:
        if target.owner == self._owner and target.name in self._segments:
            return True
        return (
            target.shm_path is not None
            and target.host_id == self._host_id
            and os.path.exists(target.shm_path)
        )

    def _target_view(self, target: SegmentInfo) -> memoryview:
        if target.owner == self._owner and target.name in self._segments:
            return self._segments.get(target.name).view
        assert target.shm_path is not None
        with self._lock:
            mm = self._maps.get(target.shm_path)
            if mm is None:
                mm = shm.map_peer(target.shm_path, target.size)
                self._maps[target.shm_path] = mm
        return memoryview(mm)

    def tasks(self, batch: Batch, jobs: list[Job]) -> list[Task]:
        slices = [s for j in jobs for s in cut(j, max(j.length, 1))]
        return [lambda: self._run(batch, slices)]

    def run_single(self, op: Op, local: memoryview, target: SegmentInfo, offset: int) -> bool:
        """One copy in the caller's thread (no batch, task or thread hand-off). False when it
        cannot be done here (the general path then reports the error)."""
        try:
            span = self._target_view(target)[offset : offset + local.nbytes]
        except (OSError, ValueError, shm.TransferError):
            return False
        if span.nbytes != local.nbytes:
            return False
        if op is Op.WRITE:
            span[:] = local
        else:
            local[:] = span
        return True

    def _run(self, batch: Batch, slices: list[Slice]) -> None:
        for s in slices:
            try:
                remote = self._target_view(s.job.target)
                span = remote[s.target_offset : s.target_offset + s.length]
                if span.nbytes != s.length:
                    raise shm.TransferError("target range beyond the mapped segment")
                if s.job.op is Op.WRITE:
                    span[:] = s.local
                else:
                    s.local[:] = span
            except Exception as exc:
                batch.slice_done(s, exc)
            else:
                batch.slice_done(s)

    def forget(self, shm_path: str) -> None:
        with self._lock:
            mm = self._maps.pop(shm_path, None)
        if mm is not None:
            with contextlib.suppress(BufferError):
                mm.close()

    def close(self) -> None:
        with self._lock:
            maps, self._maps = list(self._maps.values()), {}
        for mm in maps:
            with contextlib.suppress(BufferError):
                mm.close()
