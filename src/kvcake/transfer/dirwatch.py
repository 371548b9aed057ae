"""Keeping an engine's segments published while the directory comes and goes.

A directory restarts empty (or is told by the store master to drop a process it believed dead),
and nobody else can put our entries back: peers then get "unknown segment" for our memory until
we publish again. :class:`DirectoryWatch` asks the directory about each of the engine's
segments once per ``interval_s`` (its heartbeat) and publishes again every one that is missing,
held by another owner or stale, and all of them when the directory's boot id changed (a new
directory process: even entries that look right may be from a replayed log). Store clients
have the same duty through the master's "remount" answer (``store.liveness``); this covers the
engines that hold no store segment, such as a serving instance's KV segment.
"""

from __future__ import annotations

import logging
import threading

from kvcake.transfer.engine import TransferEngine
from kvcake.transfer.errors import TransferError, UnknownSegment
from kvcake.transfer.metadata import DirectoryClient

log = logging.getLogger(__name__)


class DirectoryWatch:
    """``DirectoryWatch(engine).start()``; :meth:`check` is one round (tests call it)."""

    def __init__(self, engine: TransferEngine, interval_s: float = 1.0):
        self.engine = engine
        self.interval_s = interval_s
        self.boot = ""  # the directory boot id our entries were last checked against
        self.republished = 0  # entries published again (tests, logs)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvcake-dirwatch", daemon=True)

    def start(self) -> DirectoryWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except TransferError as exc:  # unreachable directory: the next round tries again
                log.debug("directory check failed: %s", exc)
            except Exception:  # this thread must outlive any one failed round
                log.warning("directory check failed", exc_info=True)

    def check(self) -> int:
        """Publish again what the directory lost; returns how many entries were published."""
        directory = self.engine.registry.directory
        if directory is None:
            return 0
        names = self.engine.local_segments()
        stale = [n for n in names if not self._listed(directory, n)]
        if directory.boot and directory.boot != self.boot:
            if self.boot:
                log.warning(
                    "directory %s restarted (boot %s); publishing again",
                    directory.address,
                    directory.boot,
                )
            stale = names if self.boot else stale
        for name in stale:
            directory.publish(self.engine.segment_info(name))
            log.warning("segment %s published again in %s", name, directory.address)
        self.boot = directory.boot
        self.republished += len(stale)
        return len(stale)

    def _listed(self, directory: DirectoryClient, name: str) -> bool:
        mine = self.engine.segment_info(name)
        try:
            found = directory.lookup(name)
        except UnknownSegment:
            return False
        return bool(found.owner == mine.owner and found.paths == mine.paths)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
