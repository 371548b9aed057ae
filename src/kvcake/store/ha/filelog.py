"""The operation log on local disk (``kvcake master --state-dir DIR``): no etcd, one master.

``DIR/oplog``: frames of ``length u32 | crc32 u32 | msgpack [entry, records]``, appended and
fsynced once per group commit. ``DIR/snapshot``: the view, written to a temporary file,
fsynced and renamed; the log is then truncated (a crash between the two only leaves entries the
snapshot already covers, which :meth:`load` skips). A frame that is short or fails its CRC ends
the log: it is a write the crash cut off, and nothing after it was acknowledged.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from pathlib import Path
from typing import BinaryIO

import msgspec

from kvcake.store.ha.oplog import GroupCommitLog
from kvcake.store.ha.view import Record, Snapshot, decode_snapshot, encode_snapshot

log = logging.getLogger(__name__)
_HEAD = struct.Struct("<II")
_ENC = msgspec.msgpack.Encoder()
_ENTRY = msgspec.msgpack.Decoder(tuple[int, list[Record]])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileOpLog(GroupCommitLog):
    def __init__(
        self,
        directory: str | os.PathLike[str],
        snapshot_every: int = 20_000,
        commit_delay_s: float = 0.0,
        commit_siblings: int = 4,
    ):
        super().__init__(snapshot_every, 1, commit_delay_s, commit_siblings)
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "oplog"
        self.snap_path = self.dir / "snapshot"
        self._fh: BinaryIO | None = None

    def _read_all(self) -> tuple[Snapshot | None, list[tuple[int, list[Record]]], int]:
        snap = decode_snapshot(self.snap_path.read_bytes()) if self.snap_path.exists() else None
        entries: list[tuple[int, list[Record]]] = []
        data = self.log_path.read_bytes() if self.log_path.exists() else b""
        pos = 0
        while pos + _HEAD.size <= len(data):
            length, crc = _HEAD.unpack_from(data, pos)
            body = data[pos + _HEAD.size : pos + _HEAD.size + length]
            if len(body) < length or zlib.crc32(body) != crc:
                break
            try:
                entries.append(_ENTRY.decode(body))
            except msgspec.DecodeError:
                break
            pos += _HEAD.size + length
        if pos < len(data):
            log.warning(
                "state dir %s: dropping a torn log tail of %d bytes", self.dir, len(data) - pos
            )
        with open(self.log_path, "ab") as fh:
            fh.truncate(pos)
        self._fh = open(self.log_path, "ab")  # noqa: SIM115 (kept open for the master's life)
        return snap, entries, pos

    def _write_entry(self, number: int, records: list[Record]) -> int:
        assert self._fh is not None
        body = _ENC.encode((number, records))
        self._fh.write(_HEAD.pack(len(body), zlib.crc32(body)) + body)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        return _HEAD.size + len(body)

    def _write_snapshot(self, snap: Snapshot) -> None:
        tmp = self.snap_path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.write(encode_snapshot(snap))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.snap_path)
        _fsync_dir(self.dir)
        assert self._fh is not None
        self._fh.truncate(0)
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        super().close()
        if self._fh is not None:
            self._fh.close()
            self._fh = None
