"""Is the owner of a segment gone? Used when a restarted process re-registers a segment name its
killed predecessor still holds (SIGKILL gives no chance to unmount or unpublish).

Owner ids are Transfer Engine owners, ``"<hostname>/<pid>/<token>"``. An owner is gone when it
ran on this host (same :func:`~kvcake.transfer.registry.host_identity`) and its pid no longer
exists, or when it is a store client whose heartbeat lease expired. A process's store client
lease also covers its other engines (a serving instance's KV segments, published by a second
engine of the same ``<hostname>/<pid>``): when the master expires the process's last store
client, :meth:`ReleasingBackend.delete_process` drops their entries too. That is what frees an
instance's names on *another* host, where no pid can be checked. A live owner is never
released: a reused pid makes a dead owner look alive (safe side), never the reverse.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable

from kvcake.transfer.errors import DirectoryUnreachable, SegmentExists
from kvcake.transfer.metadata import MemoryBackend, SegEntry
from kvcake.transfer.registry import host_identity

log = logging.getLogger(__name__)


def pid_of(owner: str) -> int | None:
    parts = owner.split("/")
    if len(parts) < 3 or not parts[-2].isdigit():
        return None
    return int(parts[-2])


def process_of(owner: str) -> str | None:
    """``"<hostname>/<pid>/"``: the prefix every engine of one process shares."""
    host, _, rest = owner.partition("/")
    pid = rest.split("/", 1)[0]
    return f"{host}/{pid}/" if host and pid.isdigit() and "/" in rest else None


def process_gone(owner: str, host_id: str, here: str | None = None) -> bool:
    """True when ``owner`` ran on this host and its process no longer exists."""
    if host_id != (here or host_identity()):
        return False
    pid = pid_of(owner)
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # exists, owned by someone else
        return False
    return False


class ReleasingBackend(MemoryBackend):
    """The master's directory storage: a name held by a gone owner (``owner_gone(owner,
    host_id)``) is released to the new publisher, with every other entry of that owner.
    ``serving()`` False (an HA master whose lease is not held: store/leadership.py) refuses
    lookups, listings and publishes: its entries may be stale, a standby may lead."""

    def __init__(
        self,
        owner_gone: Callable[[str, str], bool],
        serving: Callable[[], bool] = lambda: True,
        remember: int = 4096,
    ):
        super().__init__()
        self.owner_gone = owner_gone
        self.serving = serving
        # owner -> host_id of recent publishers (bounded), so the master can still tell where a
        # released owner ran when its store segment is remounted by the successor.
        self._hosts: OrderedDict[str, str] = OrderedDict()
        self._hosts_lock = threading.Lock()
        self._remember = remember

    def host_of(self, owner: str) -> str | None:
        with self._hosts_lock:
            return self._hosts.get(owner)

    def _check_serving(self) -> None:
        if not self.serving():
            raise DirectoryUnreachable("this master is not the leader (its lease is not held)")

    def get(self, name: str) -> SegEntry | None:
        self._check_serving()
        return super().get(name)

    def list(self) -> list[SegEntry]:
        self._check_serving()
        return super().list()

    def put(self, entry: SegEntry) -> None:
        self._check_serving()
        with self._hosts_lock:
            self._hosts[entry.owner] = entry.host_id
            self._hosts.move_to_end(entry.owner)
            while len(self._hosts) > self._remember:
                self._hosts.popitem(last=False)
        try:
            super().put(entry)
        except SegmentExists:
            old = self.get(entry.name)
            if old is None or not self.owner_gone(old.owner, old.host_id):
                raise
            log.warning(
                "directory: %r was held by %s, which is gone; released to %s",
                entry.name,
                old.owner,
                entry.owner,
            )
            self.delete_owner(old.owner)
            super().put(entry)

    def delete_process(self, prefix: str) -> int:
        """Remove every entry of every owner of one process (``process_of``); how many."""
        owners = {e.owner for e in super().list() if e.owner.startswith(prefix)}
        return sum(self.delete_owner(o) for o in owners)
