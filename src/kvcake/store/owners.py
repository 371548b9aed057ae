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

A master on another host than a restarted node cannot check its predecessor's pid, and without
help refuses the name until the predecessor's lease expires (``client_ttl_s``). The successor
can check it -- it runs on the same host -- and says so (``OwnerGone``); :class:`Successors`
believes it only about an owner known to have run on the reporter's own host. That assumes the
processes of one host identity share one pid namespace (containers of one host get their own
hostname, and so their own identity).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping

from kvcake.core.ids import ClientId, SegmentName
from kvcake.store.metadata import Segment
from kvcake.transfer.errors import DirectoryUnreachable, SegmentExists
from kvcake.transfer.metadata import MemoryBackend, SegEntry
from kvcake.transfer.registry import host_identity

log = logging.getLogger(__name__)


def pid_of(owner: str) -> int | None:
    parts = owner.split("/")
    if len(parts) < 3 or not parts[-2].isdigit():
        return None
    return int(parts[-2])


def dead_here(owner: str, owner_host: str, me: str) -> bool:
    """Whether ``owner`` (which ran on ``owner_host``), another process than ``me`` (both owner
    ids), ran on this host and is gone: what a successor checks before it reports its
    predecessor (``P.OwnerGone``)."""
    return process_of(owner) != process_of(me) and process_gone(owner, owner_host)


class Successors:
    """Owners reported gone by a successor on their own host (``P.OwnerGone``), believed only
    when ``host_of(owner)`` -- where the master knows the owner ran -- is the reporter's host.
    Bounded (the oldest reports are forgotten first); thread safe."""

    def __init__(self, host_of: Callable[[str], str | None], bound: int = 4096):
        self._host_of = host_of
        self._gone: OrderedDict[str, None] = OrderedDict()
        self._bound = bound
        self._lock = threading.Lock()

    def report(self, reporter: str, host_id: str, owner: str) -> bool:
        """Take the report; False (nothing believed) when ``owner`` is not known to have run on
        ``host_id``, or is the reporter's own process."""
        if not host_id or process_of(owner) is None or process_of(owner) == process_of(reporter):
            return False
        if self._host_of(owner) != host_id:
            return False
        with self._lock:
            self._gone[owner] = None
            self._gone.move_to_end(owner)
            while len(self._gone) > self._bound:
                self._gone.popitem(last=False)
        return True

    def __contains__(self, owner: object) -> bool:
        with self._lock:
            return owner in self._gone


class OwnerWatch:
    """The master's "is this holder gone?": its pid is gone on this host, its successor on its
    own host said so (``successors``), or -- for a directory name -- it is a store client whose
    heartbeat lease expired. Where an owner ran comes from the directory (``directory``, set
    once the master has one) or, before a replayed owner re-published there, from the segment
    it mounted."""

    def __init__(
        self,
        lease_expired: Callable[[str], bool],
        segments: Callable[[], Mapping[SegmentName, Segment]],
    ):
        self._lease_expired = lease_expired
        self._segments = segments
        self.directory: ReleasingBackend | None = None
        self.successors = Successors(self.host_of)

    def holder_gone(self, owner: str, host_id: str) -> bool:
        """A directory name's holder (``ReleasingBackend``'s ``owner_gone``)."""
        return (
            process_gone(owner, host_id) or owner in self.successors or self._lease_expired(owner)
        )

    def segment_owner_dead(self, client: ClientId, segment: SegmentName) -> bool:
        """A mounted segment's owner (the master state's ``owner_dead``)."""
        if client in self.successors:
            return True
        seg = self._segments().get(segment)
        host_id = self._directory_host(client) or (seg.host_id if seg is not None else None)
        return bool(host_id) and process_gone(client, host_id or "")

    def host_of(self, owner: str) -> str | None:
        segs = list(self._segments().values())
        return self._directory_host(owner) or next(
            (s.host_id for s in segs if s.client == owner and s.host_id), None
        )

    def _directory_host(self, owner: str) -> str | None:
        return self.directory.host_of(owner) if self.directory is not None else None


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
