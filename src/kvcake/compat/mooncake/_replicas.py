"""Replica descriptors, ``batch_replica_clear`` and the copy / move task calls.

``create_copy_task`` / ``create_move_task`` validate their input exactly as the wheel does (-704
for a missing key, -600 for an unknown segment), then run the task in the background over
kvcake's two-phase replica copy (``_tasks``); ``query_task`` reports it (-1400 for an unknown
id, the wheel's TASK_NOT_FOUND)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from kvcake.compat.mooncake._base import TASK_NOT_FOUND, Conn, check_key, returns
from kvcake.compat.mooncake._tasks import TaskTable
from kvcake.compat.mooncake._types import (
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    QueryTaskResponse,
    ReplicaDescriptor,
    ReplicaStatus,
    TaskType,
)
from kvcake.core.errors import KvcakeError, StoreError
from kvcake.store import errors as E
from kvcake.store import protocol as P

NO_TASK = (0, 0)


class Replicas:
    """Replica descriptors, replica clearing and the copy / move tasks. Owns the task table
    (made on first use; ``close`` waits for running tasks, which use the client); reaches the
    client through the Conn."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        self._tasks: TaskTable | None = None

    def close(self) -> None:
        """Running copy/move tasks finish first (they use the client): call before the Conn's
        client closes."""
        if self._tasks is not None:
            self._tasks.close()
            self._tasks = None

    def _descriptors(self, key: str, res: P.KeyResult) -> list[ReplicaDescriptor]:
        out = []
        for rep in res.replicas:
            if rep.tier == "memory":
                d = Descriptor()
                d.buffer_address, d.size = rep.offset, res.size
                # Mooncake's endpoint is the segment's name (its owner's local_hostname, e.g.
                # localhost:10001); copy/move suites compare it with the names they gave.
                d.transport_endpoint = rep.segment
                out.append(ReplicaDescriptor(ReplicaStatus.COMPLETE, memory=MemoryDescriptor(d)))
            elif rep.tier == "file":  # the file tier hands out the file's path
                disk = DiskDescriptor(rep.endpoint, res.size)
                out.append(ReplicaDescriptor(ReplicaStatus.COMPLETE, disk=disk, shared=True))
            else:
                name = hashlib.blake2b(key.encode(), digest_size=16).hexdigest()
                disk = DiskDescriptor(f"{rep.segment}/{name}.obj", res.size)
                out.append(ReplicaDescriptor(ReplicaStatus.COMPLETE, disk=disk))
        return out

    @returns([])
    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        check_key(key)
        try:
            res = self._conn.c.get_replica_desc(key)
        except E.ObjectNotFound:
            return []
        return self._descriptors(key, res)

    @returns({})
    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[ReplicaDescriptor]]:
        """Only keys that exist appear in the result (as in the wheel)."""
        if not keys:
            return {}
        reply = self._conn.c.conn.call(P.GetReplicas(self._conn.c.id, list(keys)))
        return {
            k: self._descriptors(k, res)
            for k, res in zip(keys, reply.results, strict=True)
            if res.code == 0
        }

    @returns([])
    def batch_replica_clear(self, keys: list[str], segment_name: str = "") -> list[str]:
        """Drop the replicas of each key whose read lease has expired; returns the keys
        cleared (missing and leased keys are not). With ``segment_name`` (the client's own
        hostname names its own segments) only the replicas on that segment go: a key with
        replicas elsewhere keeps those, one with none left is removed. Reading the replica
        list takes a lease in kvcake, so for those keys the lease check is the list lookup's."""
        if not keys:
            return []
        c = self._conn.c
        if not segment_name:
            results = c.batch_remove(list(keys))  # non-forced: leased keys answer -706
            return [k for k, r in zip(keys, results, strict=True) if r is None]
        reply = c.conn.call(P.GetReplicas(c.id, list(keys)))
        own = set(c.segments) if segment_name == self._conn.hostname else set()
        on = {segment_name} | own
        whole, partly = [], []
        for k, res in zip(keys, reply.results, strict=True):
            here = [r.segment for r in res.replicas if r.segment in on] if res.code == 0 else []
            if here and len(here) == len(res.replicas):
                whole.append(k)
            elif here:
                partly.append((k, here))
        results = c.batch_remove(whole, force=True) if whole else []
        cleared = {k for k, r in zip(whole, results, strict=True) if r is None}
        for key, segs in partly:
            try:
                for seg in segs:
                    c.drop_replica(key, seg)
            except StoreError:
                continue
            cleared.add(key)
        return [k for k in keys if k in cleared]

    def _task_precheck(self, key: str, segments: list[str]) -> int:
        check_key(key)
        if not key or not segments or any(not s for s in segments):
            return E.INVALID_PARAMS
        if not self._conn.c.is_exist(key):
            return E.OBJECT_NOT_FOUND
        for s in segments:
            if s == self._conn.hostname:
                continue
            try:
                self._conn.c.engine.segment_info(s)
            except KvcakeError:
                return E.INVALID_PARAMS
        return 0

    def _segment(self, name: str) -> str:
        """Mooncake names a client's segment by its hostname: that is our own segment."""
        own = list(self._conn.c.segments)
        return own[0] if name == self._conn.hostname and own else name

    def _task_table(self) -> TaskTable:
        if self._tasks is None:
            digest = hashlib.blake2b(self._conn.hostname.encode(), digest_size=16).digest()
            self._tasks = TaskTable(
                (int.from_bytes(digest[:8]) >> 1, int.from_bytes(digest[8:]) >> 1)
            )
        return self._tasks

    def _start_task(
        self, key: str, segments: list[str], kind: TaskType, run: Callable[[], None]
    ) -> tuple[tuple[int, int], int]:
        if self._conn.client is None:
            return NO_TASK, E.INTERNAL_ERROR
        try:
            code = self._task_precheck(key, segments)
        except StoreError as exc:
            return NO_TASK, exc.code
        if code:
            return NO_TASK, code
        tid = self._task_table().submit(kind, run)
        return (NO_TASK, E.INTERNAL_ERROR) if tid is None else (tid, 0)

    def create_copy_task(self, key: str, targets: list[str]) -> tuple[tuple[int, int], int]:
        targets = list(targets)

        def run() -> None:
            self._conn.c.copy_replica(key, [self._segment(t) for t in targets])

        return self._start_task(key, targets, TaskType.REPLICA_COPY, run)

    def create_move_task(self, key: str, source: str, target: str) -> tuple[tuple[int, int], int]:
        if source == target and self._conn.client is not None:
            return NO_TASK, E.INVALID_PARAMS  # as the wheel: a move onto its own source

        def run() -> None:
            self._conn.c.move_replica(key, self._segment(source), self._segment(target))

        return self._start_task(key, [source, target], TaskType.REPLICA_MOVE, run)

    def query_task(self, task_id: tuple[int, int]) -> tuple[QueryTaskResponse | None, int]:
        if not isinstance(task_id, tuple) or len(task_id) != 2:
            raise TypeError("task_id must be a (int, int) tuple")
        rec = self._tasks.query(task_id) if self._tasks is not None else None
        return (rec, 0) if rec is not None else (None, TASK_NOT_FOUND)
