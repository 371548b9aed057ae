"""The operation log in etcd, fenced by the leader key.

Layout under ``/kvcake/<cluster>/``: ``leader`` (the election key, see :mod:`.election`),
``log/<entry:020d>`` (one group commit each: msgpack records), ``snap/meta`` (msgpack
``(gen, chunks, seq)``) and ``snap/<gen:020d>/<i:06d>`` (the snapshot in <= 1 MiB chunks: etcd
refuses requests over 1.5 MiB).

Fencing: every write is a transaction whose compare is "the leader key's create_revision is the
one we created". A master that lost its lease (the key was deleted, or re-created by another
master) fails that compare, so it cannot make a record durable and therefore cannot
acknowledge a write; it raises :class:`LogFailed` and steps down.
"""

from __future__ import annotations

import logging
import time

import msgspec

from kvcake.store.ha.etcd import Etcd, EtcdError, cmp_create, op_delete, op_put, prefix_end
from kvcake.store.ha.oplog import GroupCommitLog, LogFailed
from kvcake.store.ha.view import (
    Record,
    Snapshot,
    decode_records,
    decode_snapshot,
    encode_records,
    encode_snapshot,
)

log = logging.getLogger(__name__)
CHUNK = 1 << 20
_ENC = msgspec.msgpack.Encoder()
_META = msgspec.msgpack.Decoder(tuple[int, int, int])


def cluster_prefix(cluster: str) -> bytes:
    return f"/kvcake/{cluster}/".encode()


class EtcdOpLog(GroupCommitLog):
    def __init__(
        self,
        etcd: Etcd,
        cluster: str,
        leader_revision: int,
        snapshot_every: int = 20_000,
        retry_s: float = 2.0,
        depth: int = 1,
        commit_delay_s: float = 0.0,
        commit_siblings: int = 4,
    ):
        super().__init__(snapshot_every, depth, commit_delay_s, commit_siblings)
        self.etcd = etcd
        self.root = cluster_prefix(cluster)
        self.leader_key = self.root + b"leader"
        self.revision = leader_revision
        self.retry_s = retry_s  # transient etcd errors are retried this long (then: step down)

    def _log_key(self, n: int) -> bytes:
        return self.root + b"log/%020d" % n

    def _read_all(self) -> tuple[Snapshot | None, list[tuple[int, list[Record]]], int]:
        snap = None
        meta = self.etcd.get(self.root + b"snap/meta")
        if meta is not None:
            gen, chunks, _seq = _META.decode(meta[0])
            parts = self.etcd.get_prefix(self.root + b"snap/%020d/" % gen)
            if len(parts) != chunks:
                raise LogFailed(f"snapshot {gen} has {len(parts)} of {chunks} chunks")
            snap = decode_snapshot(b"".join(v for _, v in parts))
        entries = []
        prefix = self.root + b"log/"
        nbytes = 0
        for key, value in self.etcd.get_prefix(prefix):
            entries.append((int(key[len(prefix) :]), decode_records(value)))
            nbytes += len(value)
        return snap, entries, nbytes

    def _fenced(self, ops: list[dict[str, object]]) -> int:
        """Run ``ops`` if we still lead; returns etcd's revision after them."""
        deadline = time.monotonic() + self.retry_s
        while True:
            try:
                ok, data = self.etcd.txn([cmp_create(self.leader_key, self.revision)], ops)
                break
            except EtcdError as exc:
                if time.monotonic() >= deadline:
                    raise LogFailed(f"etcd unreachable: {exc}") from exc
                time.sleep(0.05)
        if not ok:
            raise LogFailed("fenced: another master holds the leader key")
        return int(data.get("header", {}).get("revision", 0))

    def _compact(self, revision: int) -> None:
        """The snapshot covers every older log entry: drop etcd's history of them (a failure
        costs only space, so it is logged, not raised; the next snapshot tries again)."""
        if revision <= 0:
            return
        try:
            self.etcd.compact(revision)
        except EtcdError as exc:
            log.warning("oplog: etcd compaction at revision %d failed: %s", revision, exc)

    def _truncate(self, first: int) -> None:
        self._fenced([op_delete(self._log_key(first), prefix_end(self.root + b"log/"))])

    def _write_entry(self, number: int, records: list[Record]) -> int:
        data = encode_records(records)
        self._fenced([op_put(self._log_key(number), data)])
        return len(data)

    def _write_snapshot(self, snap: Snapshot) -> None:
        data = encode_snapshot(snap)
        gen = snap.seq
        chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
        base = self.root + b"snap/%020d/" % gen
        for i, chunk in enumerate(chunks):
            self._fenced([op_put(base + b"%06d" % i, chunk)])
        old = self.etcd.get(self.root + b"snap/meta")
        ops = [
            op_put(self.root + b"snap/meta", _ENC.encode((gen, len(chunks), snap.seq))),
            op_delete(self.root + b"log/", self._log_key(snap.seq + 1)),
        ]
        if old is not None:
            old_gen = _META.decode(old[0])[0]
            if old_gen != gen:
                old_base = self.root + b"snap/%020d/" % old_gen
                ops.append(op_delete(old_base, prefix_end(old_base)))
        revision = self._fenced(ops)
        self._compact(revision)
        log.info("oplog: snapshot at entry %d (%d bytes, %d chunks)", gen, len(data), len(chunks))
