"""A controllable in-memory operation log for the group-commit tests (pure logic of
:class:`GroupCommitLog`): entries become durable when the test opens ``gate``."""

from __future__ import annotations

import threading

from kvcake.store.ha.oplog import GroupCommitLog
from kvcake.store.ha.view import ObjRec, Record, Snapshot


class GatedLog(GroupCommitLog):
    """Entries become durable when the test opens ``gate``; ``broken`` makes writes fail."""

    def __init__(self, commit_delay_s: float = 0.0, commit_siblings: int = 4) -> None:
        super().__init__(commit_delay_s=commit_delay_s, commit_siblings=commit_siblings)
        self.gate = threading.Event()
        self.gate.set()
        self.broken = False
        self.entries: list[tuple[int, list[Record]]] = []
        self.writer_threads: set[str] = set()

    def _read_all(self) -> tuple[Snapshot | None, list[tuple[int, list[Record]]], int]:
        return None, [], 0

    def _write_entry(self, number: int, records: list[Record]) -> int:
        self.writer_threads.add(threading.current_thread().name)
        assert self.gate.wait(10)
        if self.broken:
            raise OSError("storage gone")
        self.entries.append((number, records))
        return 0

    def _write_snapshot(self, snap: Snapshot) -> None:
        pass


def rec(i: int) -> ObjRec:
    return ObjRec(f"k{i}", 100, False, [("seg", i * 128, "memory")], sums=[i])
