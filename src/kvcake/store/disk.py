"""The SSD tier of a storage node: one file per object, verified on every read and at start-up,
and a small TCP service that streams verified copies to readers.

File layout (little endian, version 2): ``b"KVCD"`` | version u8 | pad 3 | key_len u32 |
size u64 | n_sums u32 | pad 4 | key (utf-8) | n_sums x u64 checksums | value. The checksums are
the object's own (core/integrity.py: XXH3-64 per 1 MiB chunk, seeded by the key), carried from
the writer through the master, never recomputed from the bytes being stored. Files are written
to a temporary name and renamed, so a crash leaves either the old state or a temp file (removed
at start-up). A restarted node keeps only files whose header, length and checksums check out;
it trusts nothing it cannot verify. Version 1 files (a CRC32, no per-key checksums, written
before checksums existed) are discarded at start-up and refused on read: a cache loses them,
it never serves bytes it cannot bind to their key.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import struct
import threading
from collections.abc import Sequence
from pathlib import Path

import msgspec

from kvcake.core import auth as _auth
from kvcake.core import framing, integrity
from kvcake.core.errors import FramingError
from kvcake.net.netserver import ThreadedServer
from kvcake.store.errors import (
    CHECKSUM_MISMATCH,
    INVALID_PARAMS,
    OBJECT_NOT_FOUND,
    ChecksumMismatch,
    InvalidParams,
    ObjectNotFound,
    RpcFailed,
    Unauthorized,
    error_for,
)

log = logging.getLogger(__name__)
HEAD = struct.Struct("<4sB3xIQI4x")
MAGIC = b"KVCD"
VERSION = 2
SUMS = struct.Struct("<Q")


class DiskTier:
    """Object files under ``root``. Thread-safe (one lock per operation on the index)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.index: dict[str, int] = {}  # key -> size of verified files
        self.sums: dict[str, list[int]] = {}  # key -> the checksums its file carries

    def path(self, key: str) -> Path:
        return self.root / f"{hashlib.blake2b(key.encode(), digest_size=16).hexdigest()}.obj"

    def scan(self) -> list[tuple[str, int, list[int]]]:
        """Verify every file; delete the ones that fail (older formats included). Returns the
        (key, size, checksums) kept."""
        kept = []
        for p in sorted(self.root.iterdir()):
            try:
                key, size, sums = self._verify_file(p)
            except (OSError, ValueError, UnicodeDecodeError, ChecksumMismatch) as exc:
                log.warning("disk tier: dropping %s (%s)", p.name, exc)
                with contextlib.suppress(OSError):
                    p.unlink()
                continue
            kept.append((key, size, sums))
            self.index[key] = size
            self.sums[key] = sums
        return kept

    def _verify_file(self, p: Path) -> tuple[str, int, list[int]]:
        if p.suffix != ".obj":
            raise ValueError("not an object file")
        with p.open("rb") as fh:
            raw = fh.read()
        key, size, sums, start = _parse(raw)
        if p != self.path(key):
            raise ValueError("file name does not match its key")
        if integrity.verify_whole(key, sums, memoryview(raw)[start:]):
            raise ChecksumMismatch("checksum mismatch")
        return key, size, sums

    def write(self, key: str, data: memoryview, sums: Sequence[int]) -> None:
        """Store ``data`` with the object's checksums ``sums`` (carried, not recomputed): a
        copy that does not verify against them is refused (ChecksumMismatch), never stored."""
        bad = integrity.verify_whole(key, sums, data)
        if bad:
            raise ChecksumMismatch(f"{key!r}: the source fails its checksums (chunks {bad[:4]})")
        write_object_file(self.path(key), key, data, sums)
        with self._lock:
            self.index[key] = data.nbytes
            self.sums[key] = list(sums)

    def read_into(self, key: str, out: memoryview, sums: Sequence[int] | None = None) -> int:
        """Copy the verified value of ``key`` into ``out``; ChecksumMismatch drops the file.
        ``sums``: the master's checksums of the object, which the file's must equal."""
        p = self.path(key)
        try:
            raw = p.read_bytes()
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{key!r} is not on disk") from exc
        try:
            body = verified_value(raw, key, sums)
        except ChecksumMismatch:
            self.delete(key)
            raise
        size = body.nbytes
        if out.nbytes != size:
            raise InvalidParams(f"{key!r} has {size} bytes on disk, asked for {out.nbytes}")
        out[:size] = body
        return size

    def delete(self, key: str) -> None:
        with self._lock:
            self.index.pop(key, None)
            self.sums.pop(key, None)
        with contextlib.suppress(FileNotFoundError):
            self.path(key).unlink()

    def used_bytes(self) -> int:
        with self._lock:
            return sum(self.index.values())


def write_object_file(final: Path, key: str, data: memoryview, sums: Sequence[int]) -> None:
    """Write ``key``'s value with its checksums as one object file (the layout above): a
    temporary name in the same directory, then an atomic rename, so readers see the old file
    or the whole new one."""
    if not integrity.well_formed(data.nbytes, sums):
        raise ChecksumMismatch(f"{key!r}: {len(sums)} checksums for {data.nbytes} bytes")
    kb = key.encode()
    head = HEAD.pack(MAGIC, VERSION, len(kb), data.nbytes, len(sums))
    tmp = final.with_name(f"{final.name}.tmp{os.getpid()}.{threading.get_ident()}")
    try:
        with tmp.open("wb") as fh:
            fh.write(head + kb + b"".join(SUMS.pack(x) for x in sums))
            fh.write(data)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def verified_value(raw: bytes, key: str, sums: Sequence[int] | None = None) -> memoryview:
    """The value in an object file's bytes ``raw``, after checking its header, length, key and
    checksums (and, with ``sums``, that they are the object's: a file of an older version of
    the key is refused); ChecksumMismatch (with the reason) when any of them fails."""
    try:
        got, _size, stored, start = _parse(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ChecksumMismatch(f"{key!r}: corrupt or old-format file header ({exc})") from exc
    body = memoryview(raw)[start:]
    if got != key:
        raise ChecksumMismatch(f"{key!r}: the file holds another key")
    if sums is not None and list(sums) != stored:
        raise ChecksumMismatch(f"{key!r}: the file's checksums are not the object's")
    bad = integrity.verify_whole(key, stored, body)
    if bad:
        raise ChecksumMismatch(f"{key!r}: checksum mismatch in the file (chunks {bad[:4]})")
    return body


def _parse(raw: bytes) -> tuple[str, int, list[int], int]:
    if len(raw) < HEAD.size:
        raise ValueError("file shorter than its header")
    magic, version, klen, size, nsums = HEAD.unpack_from(raw)
    if magic != MAGIC:
        raise ValueError("bad magic")
    if version != VERSION:
        raise ValueError(f"format version {version} (before checksums): not trusted")
    sums_at = HEAD.size + klen
    start = sums_at + nsums * SUMS.size
    if len(raw) != start + size or nsums != integrity.chunk_count(size):
        raise ValueError(f"length {len(raw)} != header + key + sums + {size}")
    sums = [SUMS.unpack_from(raw, sums_at + i * SUMS.size)[0] for i in range(nsums)]
    return raw[HEAD.size : sums_at].decode(), size, sums, start


# --- serving disk copies to readers ------------------------------------------------------------


class DiskRead(msgspec.Struct, tag=True):
    key: str
    size: int


class DiskReply(msgspec.Struct, tag=True):
    code: int
    message: str = ""


REQ = framing.Codec(DiskRead)
REP = framing.Codec(DiskReply)
LIMITS = framing.FrameLimits(max_meta=1 << 16, max_data=0)


class DiskService(ThreadedServer):
    """Answers ``DiskRead`` with the verified bytes as the frame's data section."""

    def __init__(
        self, tier: DiskTier, host: str, port: int = 0, auth: _auth.Authenticator | None = None
    ):
        super().__init__((host,), port, name=_auth.DISK, auth=auth)
        self.tier = tier

    def handle(self, conn: socket.socket, listen_address: str) -> None:
        while True:
            try:
                frame = framing.read_frame(conn, REQ, LIMITS)
            except FramingError as exc:
                framing.send_frame(conn, REP, 0, DiskReply(INVALID_PARAMS, str(exc)))
                close_gracefully(conn)
                return
            if frame is None:
                return
            msg = frame.msg
            rid = frame.header.request_id
            if not 0 < msg.size <= 1 << 40:
                framing.send_frame(conn, REP, rid, DiskReply(INVALID_PARAMS, "bad size"))
                continue
            buf = bytearray(msg.size)
            try:
                self.tier.read_into(msg.key, memoryview(buf))
            except ObjectNotFound as exc:
                framing.send_frame(conn, REP, rid, DiskReply(OBJECT_NOT_FOUND, str(exc)))
            except InvalidParams as exc:
                framing.send_frame(conn, REP, rid, DiskReply(INVALID_PARAMS, str(exc)))
            except ChecksumMismatch as exc:
                framing.send_frame(conn, REP, rid, DiskReply(CHECKSUM_MISMATCH, str(exc)))
            else:
                framing.send_frame(conn, REP, rid, DiskReply(0), buf)


def close_gracefully(
    conn: socket.socket, drain_s: float = 0.2, drain_bytes: int = 64 << 20
) -> None:
    """Half-close, then discard what the peer still sends (up to ``drain_bytes``, ``drain_s``
    per read): closing with unread input makes the kernel send RST, which can destroy the
    error reply just sent."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(drain_s)
        while drain_bytes > 0:
            n = len(conn.recv(1 << 16))
            if not n:
                break
            drain_bytes -= n


def read_remote(
    endpoint: str, key: str, out: memoryview, auth: _auth.Authenticator | None = None
) -> None:
    """Fetch ``key`` from a node's disk service straight into ``out``."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            if auth is not None:
                auth.client_handshake(sock, _auth.DISK, endpoint)
            framing.send_frame(sock, REQ, 1, DiskRead(key, out.nbytes))
            hdr = framing.read_header(sock)
            if hdr is None:
                raise RpcFailed(f"disk service {endpoint} closed the connection")
            meta = bytearray(hdr.meta_len)
            framing.recv_exact_into(sock, memoryview(meta))
            reply = REP.decode(meta)
            if reply.code != 0:
                raise error_for(reply.code, reply.message)
            if hdr.data_len != out.nbytes:
                raise RpcFailed(f"disk service sent {hdr.data_len} bytes, wanted {out.nbytes}")
            framing.recv_exact_into(sock, out)
    except _auth.AuthError as exc:  # (AuthRequired is a FramingError: first)
        raise Unauthorized(f"disk service {endpoint}: {exc}") from exc
    except (OSError, FramingError, ValueError) as exc:
        raise RpcFailed(f"disk service {endpoint}: {exc}") from exc
