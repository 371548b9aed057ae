"""The master's bookkeeping records: segments, objects, replicas and pending node tasks.

Locking: these records are owned by :class:`~kvcake.store.master_state.MasterState` and are only
touched under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from kvcake.core.ids import ClientId, ObjectKey, SegmentName
from kvcake.store.allocator import RangeAllocator


class Tier(StrEnum):
    MEMORY = "memory"
    DISK = "disk"  # a storage node's SSD tier (store-server --ssd-dir), read via its disk service
    FILE = "file"  # the master's shared file tier (--root-fs-dir), read from the path directly


class Status(StrEnum):
    PROCESSING = "processing"  # space allocated, bytes being written: invisible to readers
    COMPLETE = "complete"


@dataclass
class Segment:
    """A mounted range of memory (or disk quota). Its bytes belong to ``client``'s process; the
    master only allocates ranges of it."""

    name: SegmentName
    client: ClientId
    host: str
    tier: Tier
    allocator: RangeAllocator
    endpoint: str = ""  # disk tier: host:port of the node's disk service
    host_id: str = ""  # the owner's transfer.registry.host_identity(): can its pid be checked here?
    # Writes with an older fence are stale: allocated by an earlier master or mount (fences.py)
    fence_floor: int = 0

    def free_ratio(self) -> float:
        return self.allocator.free / self.allocator.capacity


@dataclass
class Replica:
    segment: SegmentName
    offset: int
    size: int
    tier: Tier
    complete: bool  # a replica copy in flight (offload, promotion) is not read from
    fence: int = 0  # its writer's allocation (store/fences.py); 0: none (replayed, disk)


@dataclass
class ObjectMeta:
    key: ObjectKey
    size: int
    status: Status
    writer: ClientId
    put_started: float
    replicas: list[Replica] = field(default_factory=list)
    lease_until: float = 0.0
    hard_pin: bool = False
    soft_pin_until: float = 0.0
    soft_pin_ttl_s: float = 0.0
    disk_hits: int = 0
    copying: bool = False  # an offload/promotion task is in flight
    tenant: str = ""  # charged with ``size`` (store/tenants.py); "" = no tenant
    # The writer's checksums (core/integrity.py), carried by every copy; [] = none (a reader
    # that verifies never accepts such an object)
    sums: list[int] = field(default_factory=list)

    def readable(self) -> list[Replica]:
        if self.status is not Status.COMPLETE:
            return []
        return [r for r in self.replicas if r.complete]

    def memory(self) -> list[Replica]:
        return [r for r in self.replicas if r.tier is Tier.MEMORY]

    def disk(self) -> list[Replica]:
        return [r for r in self.replicas if r.tier is Tier.DISK]

    def persistent(self) -> list[Replica]:
        """Replicas that outlive the memory copies: the SSD tier's and the file tier's."""
        return [r for r in self.replicas if r.tier is not Tier.MEMORY]


@dataclass
class ClientInfo:
    id: ClientId
    host: str
    last_seen: float
    segments: set[SegmentName] = field(default_factory=set)


@dataclass(frozen=True)
class NodeTask:
    """Work the master asks a storage node to do on its own segments.

    ``offload``: copy [mem_offset, +size) of its memory segment to disk as ``key``.
    ``promote``: copy the disk copy of ``key`` into [mem_offset, +size) of its memory segment.
    ``delete``: drop the disk copy of ``key``."""

    kind: str
    key: ObjectKey
    size: int
    mem_offset: int
    sums: tuple[int, ...] = ()  # offload/promote: the object's checksums the node verifies
