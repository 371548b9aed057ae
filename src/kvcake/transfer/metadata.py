"""The one metadata service: segment name -> where and how to reach it.

:class:`DirectoryService` is embeddable (the store master hosts it in-process) or runs alone
(``kvcake transfer-server --metadata``). Storage sits behind :class:`DirectoryBackend` so an
etcd backend can replace :class:`MemoryBackend` later without touching callers.

Wire: kvcake frames (``core.framing``) carrying the tagged structs below; one reply per request.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
from abc import ABC, abstractmethod

import msgspec

from kvcake.core import framing
from kvcake.core.auth import DIRECTORY, Authenticator, AuthError, resolve
from kvcake.core.errors import FramingError, MalformedFrame, TruncatedFrame
from kvcake.core.ids import SegmentName
from kvcake.net.netserver import ThreadedServer, split_address
from kvcake.transfer.errors import (
    AuthFailed,
    DirectoryUnreachable,
    SegmentExists,
    TransferError,
    UnknownSegment,
)
from kvcake.transfer.types import PathInfo, SegmentInfo


class SegEntry(msgspec.Struct, frozen=True):
    name: str
    owner: str
    host: str
    host_id: str
    size: int
    paths: list[tuple[str, int]]
    shm_path: str | None = None

    @staticmethod
    def of(info: SegmentInfo) -> SegEntry:
        paths = [(p.address, p.tier) for p in info.paths]
        return SegEntry(
            info.name, info.owner, info.host, info.host_id, info.size, paths, info.shm_path
        )

    def info(self) -> SegmentInfo:
        paths = tuple(PathInfo(a, t) for a, t in self.paths)
        return SegmentInfo(
            SegmentName(self.name),
            self.owner,
            self.host,
            self.host_id,
            self.size,
            paths,
            self.shm_path,
        )


class Publish(msgspec.Struct, tag=True):
    entry: SegEntry


class Unpublish(msgspec.Struct, tag=True):
    name: str
    owner: str


class Lookup(msgspec.Struct, tag=True):
    name: str


class ListAll(msgspec.Struct, tag=True):
    pass


class DropOwner(msgspec.Struct, tag=True):
    owner: str


class Reply(msgspec.Struct, tag=True):
    ok: bool
    error: str | None = None
    kind: str | None = None
    entries: list[SegEntry] = []
    count: int = 0
    boot: str = ""  # the answering service's boot id: a new one means "publish again"


CODEC = framing.Codec(Publish, Unpublish, Lookup, ListAll, DropOwner, Reply)
LIMITS = framing.FrameLimits(max_meta=1024 * 1024, max_data=0)


class DirectoryBackend(ABC):
    """Storage of segment entries. Implementations must be thread-safe; a name belongs to one
    owner at a time (re-publishing by the same owner replaces the entry)."""

    @abstractmethod
    def put(self, entry: SegEntry) -> None:
        """Store ``entry``; raise :class:`SegmentExists` if another owner holds the name."""

    @abstractmethod
    def get(self, name: str) -> SegEntry | None: ...

    @abstractmethod
    def delete(self, name: str, owner: str) -> bool:
        """Remove ``name`` if ``owner`` holds it; return whether something was removed."""

    @abstractmethod
    def list(self) -> list[SegEntry]: ...

    @abstractmethod
    def delete_owner(self, owner: str) -> int:
        """Remove every entry of ``owner`` (it died or left); return how many."""


class MemoryBackend(DirectoryBackend):
    """In-process dict guarded by one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, SegEntry] = {}

    def put(self, entry: SegEntry) -> None:
        with self._lock:
            old = self._entries.get(entry.name)
            if old is not None and old.owner != entry.owner:
                raise SegmentExists(f"segment {entry.name!r} is already owned by {old.owner}")
            self._entries[entry.name] = entry

    def get(self, name: str) -> SegEntry | None:
        with self._lock:
            return self._entries.get(name)

    def delete(self, name: str, owner: str) -> bool:
        with self._lock:
            old = self._entries.get(name)
            if old is None or old.owner != owner:
                return False
            del self._entries[name]
            return True

    def list(self) -> list[SegEntry]:
        with self._lock:
            return list(self._entries.values())

    def delete_owner(self, owner: str) -> int:
        with self._lock:
            names = [n for n, e in self._entries.items() if e.owner == owner]
            for n in names:
                del self._entries[n]
            return len(names)


def _dispatch(backend: DirectoryBackend, msg: msgspec.Struct) -> Reply:
    match msg:
        case Publish(entry=e):
            backend.put(e)
            return Reply(True)
        case Unpublish(name=n, owner=o):
            return Reply(True, count=int(backend.delete(n, o)))
        case Lookup(name=n):
            found = backend.get(n)
            if found is None:
                return Reply(False, f"unknown segment {n!r}", "UnknownSegment")
            return Reply(True, entries=[found])
        case ListAll():
            return Reply(True, entries=backend.list())
        case DropOwner(owner=o):
            return Reply(True, count=backend.delete_owner(o))
    return Reply(False, f"unexpected message {type(msg).__name__}", "InvalidRequest")


class DirectoryService(ThreadedServer):
    """The directory server. ``svc = DirectoryService("127.0.0.1"); svc.start(); svc.address;
    svc.stop()``. ``backend`` is exposed so an embedding process (the store master) can drop a
    dead owner's entries directly."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        backend: DirectoryBackend | None = None,
        auth: Authenticator | None = None,
    ):
        super().__init__((host,), port, name=DIRECTORY, auth=resolve(auth))
        self.backend = backend or MemoryBackend()
        # New with every process (and every service object): clients that see it change know
        # the entries they published may be gone (kvcake.transfer.dirwatch re-publishes).
        self.boot = secrets.token_hex(8)

    @property
    def address(self) -> str:
        return self.addresses[0]

    def drop_owner(self, owner: str) -> int:
        return self.backend.delete_owner(owner)

    def handle(self, conn: socket.socket, listen_address: str) -> None:
        while True:
            frame = framing.read_frame(conn, CODEC, LIMITS)
            if frame is None:
                return
            try:
                reply = _dispatch(self.backend, frame.msg)
            except TransferError as exc:
                reply = Reply(False, str(exc), type(exc).__name__)
            reply.boot = self.boot
            framing.send_frame(conn, CODEC, frame.header.request_id, reply)

    def __enter__(self) -> DirectoryService:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class DirectoryClient:
    """Blocking client with one connection (re-opened once after a failure); thread-safe."""

    def __init__(self, address: str, timeout_s: float = 5.0, auth: Authenticator | None = None):
        self.address = address
        self._auth = resolve(auth)
        self._host, self._port = split_address(address)
        self._timeout = timeout_s
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._rid = 0
        self.boot = ""  # the boot id of the service's last reply ("" before the first)

    def set_timeout(self, timeout_s: float) -> None:
        """Each connect and reply waits at most this long (a frozen directory host must not
        hold a caller for longer than its own deadline for the master)."""
        with self._lock:
            self._timeout = timeout_s
            if self._sock is not None:
                self._sock.settimeout(timeout_s)

    def _call(self, msg: msgspec.Struct) -> Reply:
        with self._lock:
            for attempt in (0, 1):
                try:
                    return self._roundtrip(msg)
                except AuthError as exc:  # before FramingError (AuthRequired is one)
                    self._drop()
                    raise AuthFailed(f"directory {self.address}: {exc}") from exc
                except (OSError, FramingError) as exc:
                    self._drop()
                    # Once more only for a connection found broken (a restarted service): a
                    # timeout means a frozen host, and a second wait doubled the outage of a
                    # paused leader's directory (every lookup 2 x the master call deadline).
                    if attempt or isinstance(exc, TimeoutError):
                        raise DirectoryUnreachable(
                            f"directory {self.address} unreachable: {exc}"
                        ) from exc
        raise AssertionError("unreachable")

    def _roundtrip(self, msg: msgspec.Struct) -> Reply:
        if self._sock is None:
            self._sock = socket.create_connection((self._host, self._port), self._timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._auth is not None:
                self._auth.client_handshake(self._sock, DIRECTORY, self.address)
        self._rid += 1
        framing.send_frame(self._sock, CODEC, self._rid, msg)
        frame = framing.read_frame(self._sock, CODEC, LIMITS)
        if frame is None:
            raise TruncatedFrame("directory closed the connection")
        if not isinstance(frame.msg, Reply):
            raise MalformedFrame("directory sent a non-reply")
        self.boot = frame.msg.boot or self.boot
        return frame.msg

    def _drop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    @staticmethod
    def _check(reply: Reply) -> Reply:
        if reply.ok:
            return reply
        if reply.kind == "UnknownSegment":
            raise UnknownSegment(reply.error or "unknown segment")
        if reply.kind == "SegmentExists":
            raise SegmentExists(reply.error or "segment exists")
        raise TransferError(reply.error or "directory error")

    def publish(self, info: SegmentInfo) -> None:
        self._check(self._call(Publish(SegEntry.of(info))))

    def unpublish(self, name: str, owner: str) -> bool:
        return bool(self._check(self._call(Unpublish(name, owner))).count)

    def lookup(self, name: str) -> SegmentInfo:
        return self._check(self._call(Lookup(name))).entries[0].info()

    def list(self) -> list[SegmentInfo]:
        return [e.info() for e in self._check(self._call(ListAll())).entries]

    def drop_owner(self, owner: str) -> int:
        return self._check(self._call(DropOwner(owner))).count

    def close(self) -> None:
        with self._lock:
            self._drop()
