"""Segments of one engine and its cached view of everyone else's (through the directory).

Memory ownership: see :mod:`kvcake.transfer.segments`. Publishing order: a segment enters the
local table before it is published (so a peer that finds it can use it at once) and leaves the
directory before its memory is released.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence

from kvcake.core.ids import SegmentName
from kvcake.transfer import shm
from kvcake.transfer.errors import InvalidRequest, TransferError, UnknownSegment
from kvcake.transfer.metadata import DirectoryClient
from kvcake.transfer.segments import BufferLike, LocalSegment, SegmentTable, as_byte_view
from kvcake.transfer.types import PathInfo, SegmentInfo

log = logging.getLogger(__name__)

# location -> (preferred listen hosts, secondary listen hosts): the topology matrix.
Topology = Mapping[str, tuple[Sequence[str], Sequence[str]]]


def host_identity() -> str:
    """Same value for every process of this host (and its network namespaces)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = "noboot"
    return f"{os.uname().nodename}/{boot}"


class SegmentRegistry:
    def __init__(
        self,
        owner: str,
        hostname: str,
        directory: DirectoryClient | None,
        addresses: Callable[[], list[str]],
        topology: Topology | None = None,
    ):
        self.owner = owner
        self.hostname = hostname
        self.host_id = host_identity()
        self.directory = directory
        self.topology = dict(topology or {})
        self.table = SegmentTable()
        self._addresses = addresses
        self._cache: dict[str, SegmentInfo] = {}

    def paths(self, location: str | None) -> tuple[PathInfo, ...]:
        by_host = {a.rpartition(":")[0]: a for a in self._addresses()}
        if location is None or location not in self.topology:
            return tuple(PathInfo(a, 0) for a in self._addresses())
        preferred, secondary = self.topology[location]
        out = [PathInfo(by_host[h], 0) for h in preferred if h in by_host]
        out += [PathInfo(by_host[h], 1) for h in secondary if h in by_host]
        return tuple(out)

    def publish(self, seg: LocalSegment, location: str | None) -> SegmentInfo:
        info = SegmentInfo(
            SegmentName(seg.name),
            self.owner,
            self.hostname,
            self.host_id,
            seg.size,
            self.paths(location),
            str(seg.region.path) if seg.region else None,
        )
        self.table.add(seg)
        try:
            if self.directory is not None:
                self.directory.publish(info)
        except BaseException:
            self.table.pop(seg.name)
            raise
        self._cache[seg.name] = info
        return info

    def register(self, name: str, buffer: BufferLike, location: str | None = None) -> SegmentInfo:
        """Expose a writable buffer-protocol object as segment ``name``. The caller keeps
        owning the memory and must keep it alive until :meth:`unregister`."""
        view = as_byte_view(buffer)
        if view.readonly:
            raise InvalidRequest(f"segment {name!r}: buffer is read-only")
        if view.nbytes == 0:
            raise InvalidRequest(f"segment {name!r}: buffer is empty")
        return self.publish(LocalSegment(name, view, keepalive=buffer), location)

    def allocate(self, name: str, size: int, location: str | None = None) -> memoryview:
        """Create a ``/dev/shm``-backed segment owned by the engine (same-host peers map it)."""
        region = shm.create_region(name, size)
        try:
            self.publish(LocalSegment(name, region.view(), region=region), location)
        except BaseException:
            region.close()
            raise
        return self.table.get(name).view

    def unregister(self, name: str) -> None:
        seg = self.table.pop(name)
        self._cache.pop(name, None)
        if self.directory is not None:
            try:
                self.directory.unpublish(name, self.owner)
            except TransferError as exc:
                log.warning("could not unpublish %s: %s", name, exc)
        if seg.region is not None:
            with contextlib.suppress(BufferError):
                seg.view.release()
            seg.region.close()

    def info(self, name: str) -> SegmentInfo:
        """Where segment ``name`` lives (this engine's or any peer's), asked afresh from the
        directory for a peer's segment; raises UnknownSegment."""
        if name in self.table:
            return self._cache[name]
        self._cache.pop(name, None)
        return self.target(name)

    def target(self, name: str) -> SegmentInfo:
        """Cached lookup used by transfers (dropped when a peer says it is gone)."""
        info = self._cache.get(name)
        if info is not None:
            return info
        if self.directory is None:
            raise UnknownSegment(f"segment {name!r} is unknown (no directory configured)")
        info = self.directory.lookup(name)
        self._cache[name] = info
        return info

    def names(self) -> list[str]:
        return self.table.names()

    def forget(self, name: str) -> None:
        if name not in self.table:
            self._cache.pop(name, None)
