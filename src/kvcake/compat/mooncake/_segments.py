"""Segments a set-up store mounts beyond its own: ``allocate_and_mount_segment`` (fresh memory),
``mount_segment`` (a mapped file range), their unmounting, and the SSD node's disk segment."""

from __future__ import annotations

import logging
import mmap
from typing import Any

from kvcake.compat.mooncake._base import Conn, check_signature
from kvcake.core.errors import KvcakeError
from kvcake.store import errors as E
from kvcake.store import protocol as P

log = logging.getLogger(__name__)


class Segments:
    """Mounts and unmounts segments of the Conn's client (the client owns their memory: the
    mapping or allocation lives until it is unmounted and freed or the client closes)."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    def allocate_and_mount_segment(
        self, size: int, protocol: str = "tcp", location: str = ""
    ) -> dict[str, Any]:
        check_signature(size, protocol, location, kinds=(int, str, str))
        fail = {"ret": E.INTERNAL_ERROR, "segment_ids": [], "allocated_size": 0}
        if self._conn.client is None or size <= 0:
            return fail
        c = self._conn.client
        name = f"seg-{c.id.replace('/', '-')}-{len(c.segments)}"
        try:
            c.segments[name] = c.engine.allocate_segment(name, size)
            c._mount(name)
        except KvcakeError as exc:
            log.error("allocate_and_mount_segment: %s", exc)
            c.segments.pop(name, None)
            return fail
        return {"ret": 0, "segment_ids": [name], "allocated_size": size}

    def mount_segment(
        self, path: str, size: int, offset: int = 0, protocol: str = "tcp", location: str = ""
    ) -> dict[str, Any]:
        """Map ``size`` bytes of the file ``path`` from ``offset`` and mount them."""
        check_signature(path, size, offset, protocol, location, kinds=(str, int, int, str, str))
        fail = {"ret": E.INTERNAL_ERROR, "segment_ids": []}
        if self._conn.client is None or size <= 0 or offset < 0 or offset % mmap.PAGESIZE:
            return fail
        c = self._conn.client
        name = f"file-{c.id.replace('/', '-')}-{len(c.segments)}"
        try:
            with open(path, "r+b") as fh:
                mapping = mmap.mmap(fh.fileno(), size, offset=offset)
            c.engine.register_memory(name, mapping)
            c.segments[name] = memoryview(mapping)
            c._mount(name)
        except (OSError, ValueError, KvcakeError) as exc:
            log.error("mount_segment %s: %s", path, exc)
            c.segments.pop(name, None)
            return fail
        return {"ret": 0, "segment_ids": [name]}

    def unmount_segment(self, segment_ids: list[str], grace_period_seconds: int = 0) -> int:
        """Unmount segments this client mounted (their objects leave the pool)."""
        if self._conn.client is None or not segment_ids:
            return E.INTERNAL_ERROR
        c = self._conn.client
        if any(s not in c.segments for s in segment_ids):
            return E.INTERNAL_ERROR
        for s in segment_ids:
            try:
                c.conn.call(P.Unmount(c.id, s))
            except KvcakeError:
                return E.INTERNAL_ERROR
        return 0

    def unmount_and_free_segment(
        self, segment_ids: list[str], grace_period_seconds: int = 0
    ) -> int:
        rc = self.unmount_segment(segment_ids, grace_period_seconds)
        if rc == 0:
            c = self._conn.c
            for s in segment_ids:
                c.segments.pop(s, None)
                c.engine.unregister(s)
        return rc

    def unmount_local_disk_segment(self, grace_period_seconds: int = 0) -> int:
        server = self._conn.server
        if server is None or server.disk is None:
            return 0  # the wheel: nothing mounted is nothing to do
        try:
            server.client.conn.call(P.Unmount(server.client.id, server.disk_segment))
        except KvcakeError:
            return E.INTERNAL_ERROR
        return 0
