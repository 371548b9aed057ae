"""The parts of the master's state, wired together (see
:mod:`kvcake.store.master_state` for what each owns). Each part is handed only the records and
callbacks it uses; none holds the state itself, and none takes the lock: the state calls them
with its lock held.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from kvcake.core.ids import ObjectKey
from kvcake.store.admin import AdminViews
from kvcake.store.changes import Changes
from kvcake.store.clients import ClientTable
from kvcake.store.config import MasterConfig
from kvcake.store.dedup import DedupTable
from kvcake.store.events import EventLog
from kvcake.store.filetier import FileTier
from kvcake.store.lookups import Lookups
from kvcake.store.membership import Membership, OwnerDead
from kvcake.store.metadata import ObjectMeta
from kvcake.store.objtable import ObjectTable
from kvcake.store.replica_ops import ReplicaOps
from kvcake.store.segtable import SegmentTable
from kvcake.store.tenants import TenantQuotas, parse_quotas
from kvcake.store.tiering import Tiering
from kvcake.store.writes import Writes


@dataclass
class Parts:
    changes: Changes
    dedup: DedupTable[object]
    events: EventLog
    tenants: TenantQuotas
    clients: ClientTable
    segs: SegmentTable
    files: FileTier
    table: ObjectTable
    tiering: Tiering
    replicas: ReplicaOps
    writes: Writes
    members: Membership
    lookups: Lookups
    admin: AdminViews


class PartCounter:
    """A counter one part keeps, read as an attribute of the state that owns the parts
    (``state.evicted_objects`` is ``state.parts.tiering.evicted_objects``)."""

    def __init__(self, part: str, name: str):
        self.part, self.name = part, name

    def __get__(self, state: object, owner: type | None = None) -> int:
        value = getattr(getattr(state, "parts"), self.part)  # noqa: B009
        return int(getattr(value, self.name))


def wire(
    cfg: MasterConfig, clock: Callable[[], float], owner_dead: OwnerDead, changes: Changes
) -> Parts:
    dedup: DedupTable[object] = DedupTable(cfg.dedup_sessions, cfg.dedup_pending)
    events = EventLog(cfg.events_buffer)
    tenants = TenantQuotas(parse_quotas(cfg.tenant_quotas), cfg.tenant_quota)
    clients = ClientTable(clock, cfg.client_ttl_s)
    segs = SegmentTable(changes)
    objects: OrderedDict[ObjectKey, ObjectMeta] = OrderedDict()  # LRU order
    files = FileTier(segs.segments, objects, clock, events)
    offloading: dict[ObjectKey, int] = {}  # key -> memory bytes an in-flight offload will free
    table = ObjectTable(
        objects, segs, files.free, tenants, offloading, events, changes, clock, cfg.writer_grace_s
    )
    tiering = Tiering(cfg, table, segs, files.writing, files.unlinks.append, events, changes)
    # Right after a take-over, place on re-registered nodes while any is (SegmentTable.placeable).
    placeable = partial(segs.placeable, clients.rejoin)
    writes = Writes(cfg, table, segs, files, tenants, placeable, tiering.make_room, events, changes)
    return Parts(
        changes=changes,
        dedup=dedup,
        events=events,
        tenants=tenants,
        clients=clients,
        segs=segs,
        files=files,
        table=table,
        tiering=tiering,
        replicas=ReplicaOps(table, segs, cfg.put_start_discard_s, events, changes),
        writes=writes,
        members=Membership(cfg, clients, segs, table, files, dedup, owner_dead, events, changes),
        lookups=Lookups(cfg, table, segs, tiering.start_promotion),
        admin=AdminViews(objects, segs.segments, table.leased, events),
    )
