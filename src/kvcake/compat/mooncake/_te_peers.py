"""Mooncake's addressing over kvcake's Transfer Engine.

Mooncake names an engine's memory ``host:rpc_port`` and addresses bytes by the owner's virtual
address; kvcake names segments and addresses them by offset. So every region registered through
the shim becomes a kvcake segment ``"{host}:{rpc_port}/{base:x}"``, and each shim engine hosts a
kvcake ``DirectoryService`` on its rpc port (Mooncake's P2P handshake: the segment name *is* the
address to ask). To reach ``peer_buffer_address`` on ``host:port`` the initiator lists that
peer's directory once, finds the region holding the address, and copies the region's entry into
its own directory so kvcake's engine resolves it like any segment.

Notifications (``TransferNotify``) travel the same way: a ``notify/`` entry published into the
target's directory, collected (and removed) by the target's ``get_notifies()``."""

from __future__ import annotations

import bisect
import contextlib
import secrets
import threading
from dataclasses import dataclass

from kvcake.core.ids import SegmentName
from kvcake.transfer.errors import SegmentExists, TransferError, UnknownSegment
from kvcake.transfer.metadata import DirectoryClient, MemoryBackend, SegEntry
from kvcake.transfer.types import SegmentInfo

NOTIFY_PREFIX = "notify/"
MAX_PEERS = 1024  # directory connections and region tables kept per engine


@dataclass(frozen=True)
class Region:
    base: int
    size: int
    segment: str

    def holds(self, addr: int, length: int) -> bool:
        return self.base <= addr and addr + length <= self.base + self.size


def region_name(engine_name: str, base: int) -> str:
    return f"{engine_name}/{base:x}"


def parse_region(info: SegmentInfo) -> Region | None:
    head, sep, tail = str(info.name).rpartition("/")
    if not sep or head.startswith("notify"):
        return None
    try:
        return Region(int(tail, 16), info.size, str(info.name))
    except ValueError:
        return None


class RegionTable:
    """Regions sorted by base address; ``find`` is a bisect."""

    def __init__(self, regions: list[Region] | None = None):
        self._regions = sorted(regions or [], key=lambda r: r.base)
        self._bases = [r.base for r in self._regions]

    def add(self, region: Region) -> None:
        i = bisect.bisect(self._bases, region.base)
        self._regions.insert(i, region)
        self._bases.insert(i, region.base)

    def remove(self, base: int) -> Region | None:
        i = bisect.bisect_left(self._bases, base)
        if i < len(self._bases) and self._bases[i] == base:
            self._bases.pop(i)
            return self._regions.pop(i)
        return None

    def find(self, addr: int, length: int) -> Region | None:
        i = bisect.bisect(self._bases, addr) - 1
        if i >= 0 and self._regions[i].holds(addr, length):
            return self._regions[i]
        return None

    def first(self) -> Region | None:
        return self._regions[0] if self._regions else None

    def __len__(self) -> int:
        return len(self._regions)


class Peers:
    """Region tables of peer engines (refreshed on a miss), imported into our own directory."""

    def __init__(self, backend: MemoryBackend):
        self._backend = backend
        self._lock = threading.Lock()
        self._tables: dict[str, RegionTable] = {}
        self._clients: dict[str, DirectoryClient] = {}

    def client(self, peer: str) -> DirectoryClient:
        with self._lock:
            c = self._clients.get(peer)
            if c is None:
                if len(self._clients) >= MAX_PEERS:
                    self._clients.pop(next(iter(self._clients))).close()
                c = self._clients[peer] = DirectoryClient(peer, timeout_s=5.0)
            return c

    def _refresh(self, peer: str) -> RegionTable:
        infos = self.client(peer).list()
        table = RegionTable([r for i in infos if (r := parse_region(i)) is not None])
        for info in infos:
            if parse_region(info) is not None:
                self._import(info)
        with self._lock:
            if len(self._tables) >= MAX_PEERS:
                self._tables.pop(next(iter(self._tables)))
            self._tables[peer] = table
        return table

    def _import(self, info: SegmentInfo) -> None:
        entry = SegEntry.of(info)
        old = self._backend.get(entry.name)
        if old is not None and old.owner != entry.owner:
            self._backend.delete(entry.name, old.owner)  # the peer restarted
        with contextlib.suppress(SegmentExists):
            self._backend.put(entry)

    def locate(self, peer: str, addr: int, length: int) -> Region:
        with self._lock:
            table = self._tables.get(peer)
        found = table.find(addr, length) if table is not None else None
        if found is None:
            found = self._refresh(peer).find(addr, length)
        if found is None:
            raise UnknownSegment(f"{peer}: no registered region holds [{addr:#x}, +{length})")
        return found

    def first_address(self, peer: str) -> int:
        first = self._refresh(peer).first()
        return first.base if first is not None else 0

    def notify(self, peer: str, name: str, msg: str) -> None:
        key = f"{NOTIFY_PREFIX}{secrets.token_hex(8)}"
        info = SegmentInfo(SegmentName(key), name, msg, "", 0)
        self.client(peer).publish(info)

    def close(self) -> None:
        with self._lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()
            self._tables.clear()


def take_notifies(backend: MemoryBackend) -> list[tuple[str, str]]:
    """(name, msg) of every notification delivered to us, oldest first; removes them."""
    out = []
    for e in backend.list():
        if e.name.startswith(NOTIFY_PREFIX) and backend.delete(e.name, e.owner):
            out.append((e.owner, e.host))
    return out


__all__ = ["Peers", "Region", "RegionTable", "TransferError", "region_name", "take_notifies"]
