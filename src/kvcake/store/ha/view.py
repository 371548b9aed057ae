"""What survives the master: the durable view of its metadata and the log records that change it.

A record states the *current* durable form of one segment or one object (or that it is gone),
never a delta, so replaying a record twice or a snapshot plus records it already covers yields
the same view. COMPLETE objects are recorded with their complete replicas; leases, soft pins
and LRU order reset on a new leader (as in Mooncake). What a writer may still be writing into
is recorded as a *hold*, so a new leader does not hand it out at once: a PROCESSING put's
memory ranges (:class:`ObjHeld`), the target of a copy in flight (``ObjRec.held``) and the
ranges waiting out the writer's grace (``SegRec.held``). A new leader keeps every hold for the
writer's grace from its take-over, then frees it (docs/store.md, "The writer's grace").
Wire form: msgpack (msgspec), one batch of records per log entry.
"""

from __future__ import annotations

import msgspec


class SegRec(msgspec.Struct, tag="seg", array_like=True, frozen=True):
    name: str
    client: str
    host: str
    tier: str
    capacity: int
    endpoint: str = ""
    host_id: str = ""  # records before it was kept decode with ""
    held: list[tuple[int, int]] = []  # (offset, size) in the writer's grace; older records: none


class SegGone(msgspec.Struct, tag="unseg", array_like=True, frozen=True):
    name: str


class ObjRec(msgspec.Struct, tag="obj", array_like=True, frozen=True):
    key: str
    size: int
    hard_pin: bool
    replicas: list[tuple[str, int, str]]  # (segment, offset, tier); the size is the object's
    tenant: str = ""  # charged with the size (store/tenants.py); older records: none
    sums: list[int] = []  # the object's checksums (core/integrity.py); older records: none
    held: list[tuple[str, int]] = []  # (segment, offset) of memory copies still being written


class ObjHeld(msgspec.Struct, tag="held", array_like=True, frozen=True):
    """A PROCESSING put (not readable; gone on a new leader): the memory ranges its writer
    may still be writing into."""

    key: str
    ranges: list[tuple[str, int, int]]  # (segment, offset, size)


class ObjGone(msgspec.Struct, tag="del", array_like=True, frozen=True):
    key: str


class FenceRec(msgspec.Struct, tag="fence", array_like=True, frozen=True):
    """Where a leader's write fences start (store/fences.py), logged before it hands out any:
    the next leader starts ``FENCE_GAP`` above the highest."""

    floor: int


Record = SegRec | SegGone | ObjRec | ObjHeld | ObjGone | FenceRec


class Snapshot(msgspec.Struct, frozen=True):
    seq: int  # the last log entry it covers
    segments: list[SegRec]
    objects: list[ObjRec | ObjHeld]
    fence: int = 0  # the highest FenceRec floor (older snapshots: none)


_ENC = msgspec.msgpack.Encoder()
_REC_DEC = msgspec.msgpack.Decoder(list[Record])
_SNAP_DEC = msgspec.msgpack.Decoder(Snapshot)


def encode_records(records: list[Record]) -> bytes:
    return _ENC.encode(records)


def decode_records(data: bytes) -> list[Record]:
    return _REC_DEC.decode(data)


def encode_snapshot(snap: Snapshot) -> bytes:
    return _ENC.encode(snap)


def decode_snapshot(data: bytes) -> Snapshot:
    return _SNAP_DEC.decode(data)


class View:
    """Segments and objects as the log says they are. Insertion order is last-change order,
    which a replay uses as LRU order (oldest first). Not thread-safe: the log owns it."""

    def __init__(self) -> None:
        self.seq = 0
        self.segments: dict[str, SegRec] = {}
        self.objects: dict[str, ObjRec | ObjHeld] = {}
        self.fence = 0

    def apply(self, rec: Record) -> None:
        if isinstance(rec, FenceRec):
            self.fence = max(self.fence, rec.floor)
        elif isinstance(rec, (ObjRec, ObjHeld)):
            self.objects.pop(rec.key, None)
            self.objects[rec.key] = rec
        elif isinstance(rec, ObjGone):
            self.objects.pop(rec.key, None)
        elif isinstance(rec, SegRec):
            self.segments[rec.name] = rec
        else:
            self.segments.pop(rec.name, None)

    def apply_all(self, seq: int, records: list[Record]) -> None:
        for rec in records:
            self.apply(rec)
        self.seq = max(self.seq, seq)

    def snapshot(self) -> Snapshot:
        segs, objs = list(self.segments.values()), list(self.objects.values())
        return Snapshot(self.seq, segs, objs, self.fence)

    @staticmethod
    def of(snap: Snapshot) -> View:
        view = View()
        view.seq = snap.seq
        view.segments = {s.name: s for s in snap.segments}
        view.objects = {o.key: o for o in snap.objects}
        view.fence = snap.fence
        return view
