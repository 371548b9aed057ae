"""Master RPC messages (msgpack in :mod:`kvcake.core.framing` frames over TCP).

Every request carries the caller's ``client`` id. Key-wise calls are batches: a single-key call
is a batch of one. Per-key results carry a Mooncake error code (0 = success) so one bad key does
not fail its batch. A request the master cannot decode is answered with :class:`ErrorReply`
and the connection is closed (the stream may be unsynchronised).
"""

from __future__ import annotations

from typing import get_args

import msgspec

from kvcake.core.api import StoreSnapshot
from kvcake.core.framing import Codec


class ReplicaDesc(msgspec.Struct, frozen=True):
    segment: str
    host: str
    offset: int
    size: int
    tier: str  # "memory" | "disk" | "file"
    endpoint: str = ""  # disk tier: the node's disk service host:port; file tier: the file path
    fence: int = 0  # a memory range's allocation, sent with its writes (store/fences.py)


class PutOptions(msgspec.Struct, frozen=True):
    replica_num: int = 1
    hard_pin: bool = False
    soft_pin: str = "preserve"  # preserve | enable | disable
    soft_pin_ttl_ms: int = 0  # 0 = the master's default
    preferred_segments: list[str] = []


# --- requests --------------------------------------------------------------------------------


class ReqId(msgspec.Struct, frozen=True, array_like=True):
    """Identity of one mutating request, for the master's deduplication (docs/store.md, "Retry
    semantics"). ``session`` is a random token per client connection object, ``seq`` increases
    by one per request of that session (a retry re-sends the same ``seq``), ``ack`` is the
    highest ``seq`` whose reply the session has received: the master forgets those replies and
    refuses a request with ``seq <= ack`` as a stale duplicate."""

    session: str
    seq: int
    ack: int = 0


class Heartbeat(msgspec.Struct, tag=True):
    """``client=""`` is a probe: learn the directory and TTL without registering."""

    client: str
    host: str
    fenced: int = 0  # the highest write fence this client's transfer server has noted


class Mount(msgspec.Struct, tag=True):
    client: str
    host: str
    segment: str
    capacity: int
    tier: str = "memory"
    endpoint: str = ""
    # disk tier: (key, size) of copies the node verified on disk at start-up
    existing: list[tuple[str, int]] = []
    rid: ReqId | None = None  # set by MasterConnection; None = not deduplicated
    existing_sums: list[list[int]] = []  # the checksums of each ``existing`` copy, in order
    # transfer.registry.host_identity() of the caller: a master on the same host tells a killed
    # owner by its pid, also after the master itself restarted (the segment record keeps it)
    host_id: str = ""


class Unmount(msgspec.Struct, tag=True):
    client: str
    segment: str
    rid: ReqId | None = None  # set by MasterConnection; None = not deduplicated


class PutStart(msgspec.Struct, tag=True):
    client: str
    host: str
    keys: list[str]
    sizes: list[int]
    options: PutOptions = PutOptions()
    upsert: bool = False
    rid: ReqId | None = None  # set by MasterConnection; None = not deduplicated
    tenant: str = ""  # charged for the bytes (master.tenant_quotas); "" = no tenant


class PutEnd(msgspec.Struct, tag=True):
    """``sums``: per key, the writer's checksums of the value (core/integrity.py), one list per
    key in ``keys`` order; empty = no sums (an object no verifying reader will accept)."""

    client: str
    keys: list[str]
    rid: ReqId | None = None  # set by MasterConnection; None = not deduplicated
    sums: list[list[int]] = []


class PutRevoke(msgspec.Struct, tag=True):
    client: str
    keys: list[str]
    rid: ReqId | None = None  # set by MasterConnection; None = not deduplicated


class GetReplicas(msgspec.Struct, tag=True):
    client: str
    keys: list[str]


class Exist(msgspec.Struct, tag=True):
    client: str
    keys: list[str]


class Remove(msgspec.Struct, tag=True):
    client: str
    keys: list[str]
    force: bool = False
    rid: ReqId | None = None  # set by MasterConnection; None = not deduplicated


class RemoveAll(msgspec.Struct, tag=True):
    client: str
    force: bool = False
    pattern: str = ""  # a prefix or glob (docs/store.md, "Patterns"); "" = every key
    regex: str = ""  # Mooncake's remove_by_regex: a regular expression (bounded, off-lock)
    rid: ReqId | None = None  # set by MasterConnection; None = not deduplicated


class TakeTasks(msgspec.Struct, tag=True):
    client: str
    rid: ReqId | None = None  # set by MasterConnection; None = not deduplicated


class KvSnapshot(msgspec.Struct, tag=True):
    """The pool's readable keys and the event ``seq`` they reflect (KV event resync)."""

    client: str


class BlockMeta(msgspec.Struct, frozen=True, array_like=True):
    """A KV block's lineage, as its writer knows it: the block hash (the one in its key,
    ``core.hashing.block_key``), the parent block's hash (None for a prompt's first block) and
    its token ids. Only what routers' KV events need (store/vllm_events.py)."""

    hash: int
    parent: int | None
    tokens: list[int]


class BlockInfo(msgspec.Struct, tag=True):
    """Optional, before or with a put: the lineage of the blocks being written, so the
    master's vLLM-format KV events can carry token ids and parents. Not mutating (a hint: lost
    or unknown, the blocks are just not published in that format)."""

    client: str
    blocks: list[BlockMeta]


class TaskDone(msgspec.Struct, tag=True):
    """A node's tier copy (``offload``/``promote``) or a client's file-tier write (``persist``,
    ``offset`` naming the file replica) finished."""

    client: str
    kind: str
    key: str
    ok: bool
    rid: ReqId | None = None  # set by MasterConnection; None = not deduplicated
    offset: int = -1


class ReplicaCopyStart(msgspec.Struct, tag=True):
    """New replicas of a readable object on ``targets`` (store/replica_ops.py)."""

    client: str
    key: str
    targets: list[str]
    rid: ReqId | None = None  # set by MasterConnection; None = not deduplicated


class ReplicaCopyEnd(msgspec.Struct, tag=True):
    client: str
    key: str
    ok: bool
    rid: ReqId | None = None  # set by MasterConnection; None = not deduplicated


class ReplicaDrop(msgspec.Struct, tag=True):
    client: str
    key: str
    segment: str
    rid: ReqId | None = None  # set by MasterConnection; None = not deduplicated


class OwnerGone(msgspec.Struct, tag=True):
    """``client``, starting on the host ``host_id`` (``transfer.registry.host_identity``),
    found that ``owner`` -- the holder of a segment name it is about to take -- ran on this
    same host and its process is gone (a node SIGKILLed and restarted at once). A master on
    another host cannot check that pid itself; it believes the claim only when ``owner`` is
    known to have run on ``host_id``, and then releases the owner's names as if its lease had
    expired (docs/store.md, "A restarted node"). Idempotent: not deduplicated."""

    client: str
    host_id: str
    owner: str


class ReplicaBad(msgspec.Struct, tag=True):
    """A reader found the replica of ``key`` at ``segment``/``offset`` failing ``sums`` (the
    checksums it verified against): the master drops exactly that replica if the object still
    has it with those sums (the last one too: then the object is gone)."""

    client: str
    key: str
    segment: str
    offset: int
    sums: list[int]
    rid: ReqId | None = None  # set by MasterConnection; None = not deduplicated


# Requests that change the master's state: each carries a ``rid`` and is applied at most once.
MUTATING: frozenset[str] = frozenset(
    (
        "Mount",
        "Unmount",
        "PutStart",
        "PutEnd",
        "PutRevoke",
        "Remove",
        "RemoveAll",
        "TakeTasks",
        "TaskDone",
        "ReplicaCopyStart",
        "ReplicaCopyEnd",
        "ReplicaDrop",
        "ReplicaBad",
    )
)

Request = (
    Heartbeat
    | Mount
    | Unmount
    | PutStart
    | PutEnd
    | PutRevoke
    | GetReplicas
    | Exist
    | Remove
    | RemoveAll
    | TakeTasks
    | TaskDone
    | KvSnapshot
    | BlockInfo
    | ReplicaCopyStart
    | ReplicaCopyEnd
    | ReplicaDrop
    | ReplicaBad
    | OwnerGone
)

# --- replies ---------------------------------------------------------------------------------

# A heartbeat's ``count``: mount again. REMOUNT: this master knows the client's segments (a new
# leader replayed them) but not yet the client; FORGOTTEN: it knows neither -- the client was
# expired (or the master's state lost) and every object on its segments was dropped.
REMOUNT = 1
FORGOTTEN = 2


class KeyResult(msgspec.Struct, frozen=True):
    code: int
    size: int = 0
    replicas: list[ReplicaDesc] = []
    message: str = ""
    sums: list[int] = []  # GetReplicas: the object's checksums (core/integrity.py)


class Reply(msgspec.Struct, tag=True):
    """Answer to a request: ``code`` for the whole call, ``results`` per key (batch calls)."""

    code: int = 0
    message: str = ""
    results: list[KeyResult] = []
    count: int = 0  # remove_all; heartbeat: REMOUNT or FORGOTTEN (below), 0 = known
    lease_ms: int = 0
    client_ttl_ms: int = 0
    tasks: list[tuple[str, str, int, int]] = []  # (kind, key, size, mem_offset)
    task_sums: list[list[int]] = []  # per task: the object's checksums, carried to the copy
    rejected: list[str] = []  # mount(disk): copies the node must delete
    directory: str = ""  # heartbeat: the Transfer Engine directory the master hosts
    events: str = ""  # heartbeat: the zmq PUB endpoint of the master's KV events ("" = none)
    # heartbeat: (segment, offset, size, fence) of ranges of the client's segments allocated
    # since its ``fenced`` (store/fences.py)
    fences: list[tuple[str, int, int, int]] = []
    # heartbeat, mount: (segment, fence floor) of the client's segments (store/fences.py)
    floors: list[tuple[str, int]] = []
    # PutStart / ReplicaCopyStart: the writer's grace in ms; the writer starts no copy later
    # than that after it sent the request (store/fences.py, write_deadline)
    write_lease_ms: int = 0
    snapshot: StoreSnapshot | None = None  # KvSnapshot
    # a refused mount (SegmentAlreadyExists): [owner, host_id] of the name's holder, so a
    # successor on that host can check its pid (docs/store.md, "A restarted node")
    holder: list[str] = []
    # The answering master's term (its etcd election revision; 0 without HA): a client drops
    # a reply from an older term than it has seen (docs/store.md, "Leader leases").
    term: int = 0


class ErrorReply(msgspec.Struct, tag=True):
    code: int
    message: str
    term: int = 0


# One list of request types: the codec takes them from the union, so the two cannot drift apart.
REQUESTS: tuple[type[msgspec.Struct], ...] = get_args(Request)
REQUEST_CODEC: Codec[msgspec.Struct] = Codec(*REQUESTS)
REPLY_CODEC: Codec[msgspec.Struct] = Codec(Reply, ErrorReply)
