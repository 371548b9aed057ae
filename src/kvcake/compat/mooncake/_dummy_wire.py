"""The dummy-client IPC of kvcake's ``mooncake_client`` stand-in: messages, limits and naming.

A dummy client (``MooncakeDistributedStore.setup_dummy``) holds one TCP connection on loopback to
the real client's ``--port`` and sends one request at a time (``core.framing`` frames, these
msgspec structs). Bulk data never travels in the dummy's frames: it sits in shared memory the
dummy created under ``/dev/shm`` (``kvcake-dummy-<pid>-<n>``), which the real client maps when
told (``MapSeg``) and the dummy unlinks right after, so nothing is left behind when either side
dies. A buffer is named by a :data:`Loc` ``(segment, offset, length)``: segment 0 is the dummy's
local buffer (staging for ``bytes`` values), others are ``alloc_from_mem_pool`` memory, and
``INLINE`` marks bytes in the reply's data section (values larger than the local buffer).
docs/compat/mooncake.md, "Dummy clients"."""

from __future__ import annotations

import re

import msgspec

from kvcake.core import framing
from kvcake.store.protocol import PutOptions

Loc = tuple[int, int, int]  # (segment id, offset, length)
LOCAL = 0  # the dummy's local buffer
INLINE = -1  # in the reply frame's data section

MAX_KEYS = 65536  # keys in one call
MAX_SEGMENTS = 4096  # mapped segments per dummy
MAX_SESSIONS = 64  # dummies attached at once
SHM_DIR = "/dev/shm"
SHM_NAME = re.compile(r"kvcake-dummy-[0-9]{1,10}-[0-9a-f]{1,16}-[0-9]{1,10}")
# Requests carry no data section; replies may (values too large for the local buffer).
REQUEST_LIMITS = framing.FrameLimits(max_meta=8 * 1024 * 1024, max_data=0)
REPLY_LIMITS = framing.FrameLimits(max_meta=64 * 1024 * 1024, max_data=8 * 1024**3)

OPS = frozenset(
    {"put", "upsert", "get", "get_into", "exist", "size", "remove", "remove_all", "remove_regex"}
)


class Attach(msgspec.Struct, tag=True):
    pid: int
    protocol: int = 1


class MapSeg(msgspec.Struct, tag=True):
    seg: int
    name: str
    size: int


class UnmapSeg(msgspec.Struct, tag=True):
    seg: int


class Ping(msgspec.Struct, tag=True):
    pass


class Call(msgspec.Struct, tag=True):
    """One store operation on ``keys`` (``OPS``); ``locs`` pair with ``keys`` where the op moves
    data (put sources, get_into destinations)."""

    op: str
    keys: list[str] = []
    locs: list[Loc] = []
    options: PutOptions | None = None
    force: bool = False
    pattern: str = ""
    # puts: each value's checksums (core/integrity.py), computed by the dummy over its own
    # bytes, so a corruption on the way through shared memory fails the next read
    sums: list[list[int]] = []


class Reply(msgspec.Struct, tag=True):
    """``code`` < 0: the call failed as a whole (``message`` says why). Otherwise ``codes`` per
    key (0 ok, or a Mooncake error code), ``values`` per key (sizes, 0/1) or one value, and for
    gets ``locs`` where each value was put (the local buffer or ``INLINE``)."""

    code: int = 0
    message: str = ""
    codes: list[int] = []
    values: list[int] = []
    locs: list[Loc] = []
    # gets: each value's checksums as the master holds them ([] for a failed key); the dummy
    # verifies what it received through shared memory against them
    sums: list[list[int]] = []


REQUESTS: framing.Codec[msgspec.Struct] = framing.Codec(Attach, MapSeg, UnmapSeg, Ping, Call)
REPLIES: framing.Codec[msgspec.Struct] = framing.Codec(Reply)
