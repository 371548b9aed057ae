"""The master's side of the shared file tier (``master.root_fs_dir``, Mooncake's
``--root_fs_dir``; a part of :class:`~kvcake.store.master_state.MasterState`: :class:`FileTier`).

With a root directory every put gets, besides its memory replicas, a *file replica*: a range of
the file tier's segment (``@files``, capacity ``root_fs_quota``, accounted like any segment)
whose number names the object's file, ``<root>/<cluster>/<xx>/<offset>.obj`` (the SSD tier's
verified file format, :func:`kvcake.store.disk.write_object_file`). The writing client writes
the file in the background after ``PutEnd`` and reports it (``TaskDone(kind="persist")``); the
replica becomes readable then, and from then on eviction frees the memory copies and keeps the
object, readable from its file. Readers open the path themselves (a shared filesystem path).

Life of a range (why a file name is never reused while its file may still change):
- reserved at ``put_start`` (not readable); an object dropped before ``put_end`` releases it;
- in flight from ``put_end`` until the writer reports (``file_writes``): an object dropped
  meanwhile leaves it *orphaned* (still held) until the report, so a late rename cannot land on
  a name a newer put already uses;
- complete: dropping it queues the file for unlinking (``unlinks``); the master's
  ``reap_files`` unlinks them (:func:`unlink_files`) outside the lock and only then releases
  the ranges.
A writer that never reports (gone, or silent for ``put_start_timeout_s + put_start_discard_s``)
counts as failed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from kvcake.core.api import StoreEventKind
from kvcake.core.ids import ClientId, ObjectKey, SegmentName
from kvcake.store.allocator import RangeAllocator
from kvcake.store.events import EventLog
from kvcake.store.metadata import ObjectMeta, Replica, Segment, Status, Tier

log = logging.getLogger(__name__)
FILE_SEGMENT = SegmentName("@files")  # reserved: no client may mount this name
FILE_OWNER = ClientId("@files")  # owns the segment; never a client entry, so never expires
FILE = Tier.FILE
REAP_BATCH = 1024  # files one reap_files call unlinks


def file_path(directory: str, offset: int) -> str:
    """The file of the file-tier replica at ``offset`` (256 subdirectories)."""
    return f"{directory}/{(offset >> 6) & 0xFF:02x}/{offset:012x}.obj"


def default_quota(directory: Path) -> int:
    """Mooncake's default: 90% of the size of the filesystem holding ``directory``."""
    st = os.statvfs(directory)
    return max(1 << 20, min(int(st.f_blocks * st.f_frsize * 0.9), 1 << 50))


class FileTier:
    """The file tier's records. Called with the state lock held (never takes it). Owns the
    in-flight writes (``writes``: offset -> (key, writer, put_end time), put_end order), the
    orphans among them, the complete files to unlink (``unlinks``, ranges still held) and the
    counters; reads ``objects`` and adds its segment to ``segments`` (not a memory segment, so
    no cache of the segment table goes stale)."""

    def __init__(
        self,
        segments: dict[SegmentName, Segment],
        objects: Mapping[ObjectKey, ObjectMeta],
        clock: Callable[[], float],
        events: EventLog,
    ):
        self.segments = segments
        self.objects = objects
        self.clock = clock
        self.events = events
        self.tier: Segment | None = None  # where new puts get a file replica
        self.writes: dict[int, tuple[ObjectKey, ClientId, float]] = {}
        self.orphans: set[int] = set()  # in flight, but their object is gone
        self.unlinks: list[int] = []  # complete files to unlink, ranges still held
        self.full = 0  # puts that got no file replica: the tier's quota was full
        self.failed = 0  # file writes reported failed or given up

    def mount(self, directory: str, capacity: int) -> None:
        """Put new objects' file replicas under ``directory`` (idempotent; a tier replayed
        from the operation log keeps its recorded directory and capacity)."""
        seg = self.segments.get(FILE_SEGMENT)
        if seg is None:
            alloc = RangeAllocator(capacity)
            seg = Segment(FILE_SEGMENT, FILE_OWNER, "", FILE, alloc, directory)
            self.segments[FILE_SEGMENT] = seg
        elif seg.endpoint != directory:
            log.warning(
                "file tier: the replayed tier lives in %s; %s is not used", seg.endpoint, directory
            )
        self.tier = seg

    def reserve(self, obj: ObjectMeta) -> None:
        seg = self.tier
        if seg is None:
            return
        off = seg.allocator.allocate(obj.size)
        if off is None:
            self.full += 1
            return
        obj.replicas.append(Replica(seg.name, off, obj.size, FILE, complete=False))

    def put_end(self, obj: ObjectMeta, client: ClientId) -> None:
        for rep in obj.replicas:
            if rep.tier is FILE and not rep.complete:
                self.writes[rep.offset] = (obj.key, client, self.clock())

    def free(self, rep: Replica) -> None:
        if rep.offset in self.writes:
            self.orphans.add(rep.offset)  # held until its writer reports
        elif rep.complete:
            self.unlinks.append(rep.offset)
        elif (seg := self.segments.get(FILE_SEGMENT)) is not None:
            seg.allocator.release(rep.offset)  # reserved, never written

    def writing(self, obj: ObjectMeta) -> bool:
        """Its file is being written: eviction keeps its memory copies until then."""
        return bool(self.writes) and any(r.tier is FILE and not r.complete for r in obj.replicas)

    def done(self, client: ClientId, key: str, offset: int, ok: bool) -> None:
        """The writer of the file replica at ``offset`` reports."""
        entry = self.writes.get(offset)
        if entry is None or entry[0] != key or entry[1] != client:
            return  # unknown, a duplicate, or given up already
        del self.writes[offset]
        if not ok:
            self.failed += 1
        obj = self.objects.get(ObjectKey(key))
        rep = None
        if obj is not None and offset not in self.orphans:
            rep = next((r for r in obj.replicas if r.tier is FILE and r.offset == offset), None)
        self.orphans.discard(offset)
        if obj is None or rep is None or not ok:
            if obj is not None and rep is not None:
                obj.replicas.remove(rep)
            self.unlinks.append(offset)  # a partial or orphaned file: remove it
            return
        rep.complete = True
        if obj.status is Status.COMPLETE:
            self.events.emit(StoreEventKind.STORED, (obj.key,), FILE.value)

    def abandon(self, client: ClientId | None, older_than: float) -> int:
        """Count as failed the writes of ``client`` (gone) or, with ``client=None``, those in
        flight since before ``older_than``."""
        stale = []
        for off, (key, writer, t0) in self.writes.items():
            if client is None and t0 >= older_than:
                break  # put_end order: the rest are newer
            if client is None or writer == client:
                stale.append((off, key, writer))
        for off, key, writer in stale:
            self.done(writer, key, off, ok=False)
        return len(stale)

    def take_unlinks(self, limit: int) -> tuple[list[int], Segment | None]:
        """Up to ``limit`` files to unlink, and the tier's segment (their ranges' owner)."""
        batch = self.unlinks[:limit]
        del self.unlinks[:limit]
        return batch, self.segments.get(FILE_SEGMENT)

    def release(self, seg: Segment, batch: list[int]) -> None:
        """The files of ``batch`` are gone: their ranges are reusable (unless the tier's
        segment was replaced meanwhile)."""
        if self.segments.get(FILE_SEGMENT) is seg:
            for off in batch:
                seg.allocator.release(off)


def reap_files(
    files: FileTier, lock: threading.RLock, limit: int, unlink: Callable[[str], None]
) -> int:
    """Unlink up to ``limit`` dropped files, then release their ranges. ``lock`` is the state's:
    held to take the batch and to release the ranges, not while the file system works."""
    if not files.unlinks:  # the housekeeper's every tick: no lock when idle
        return 0
    with lock:
        batch, seg = files.take_unlinks(limit)
    if not batch or seg is None:
        return 0
    for off in batch:
        with contextlib.suppress(FileNotFoundError):
            try:
                unlink(file_path(seg.endpoint, off))
            except OSError as exc:  # the range is released anyway: a new file replaces it
                log.warning("file tier: cannot unlink %s: %s", file_path(seg.endpoint, off), exc)
    with lock:
        files.release(seg, batch)
    return len(batch)
