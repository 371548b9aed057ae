"""``TransferEngine``'s transfer part: sync and async transfers between local buffers and a
peer's registered regions (addressing: :mod:`._te_peers`), with optional notifications."""

from __future__ import annotations

import itertools
import logging
import threading

from kvcake.compat.mooncake._te_memory import Endpoint, view
from kvcake.compat.mooncake._te_types import TransferNotify, _Opcode, to_op
from kvcake.core.errors import KvcakeError
from kvcake.core.ids import BatchId, SegmentName
from kvcake.transfer import Op, TransferRequest

log = logging.getLogger(__name__)
MAX_BATCHES = 4096  # outstanding async batches per engine


class Transfers:
    """Owns the table of outstanding async batches (Mooncake id -> kvcake batch; at most
    MAX_BATCHES, under its lock); reaches the kvcake engine and the regions through the
    Endpoint. The caller owns the local buffers and keeps them valid until a transfer is done."""

    def __init__(self, ep: Endpoint) -> None:
        self._ep = ep
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._batches: dict[int, tuple[BatchId | None, int]] = {}  # id -> (kvcake batch, rc)

    def _request(
        self, target: str, local: int, remote: int, length: int, op: Op
    ) -> TransferRequest | tuple[Op, memoryview, str, int]:
        """A registered-local request for a kvcake batch, or (op, view, segment, offset) for a
        local buffer that was never registered (copied with write/read_into)."""
        if length <= 0:
            raise KvcakeError(f"length must be > 0, got {length}")
        peer = self._ep.local.find(remote, length) if target == self._ep.name else None
        region = peer or self._ep.peers.locate(target, remote, length)
        off = remote - region.base
        mine = self._ep.local.find(local, length)
        if mine is None:
            return (op, view(local, length), region.segment, off)
        return TransferRequest(
            op,
            SegmentName(mine.segment),
            local - mine.base,
            SegmentName(region.segment),
            off,
            length,
        )

    def _run(
        self,
        target: str,
        locals_: list[int],
        remotes: list[int],
        lengths: list[int],
        op: Op,
        asynchronous: bool = False,
    ) -> tuple[int, BatchId | None]:
        eng = self._ep.engine
        if eng is None or not len(locals_) == len(remotes) == len(lengths) or not locals_:
            return -1, None
        try:
            reqs = [
                self._request(target, a, b, n, op)
                for a, b, n in zip(locals_, remotes, lengths, strict=True)
            ]
            batch = [r for r in reqs if isinstance(r, TransferRequest)]
            for r in reqs:
                if not isinstance(r, TransferRequest):
                    o, v, seg, off = r
                    (eng.write if o is Op.WRITE else eng.read_into)(seg, off, v)
            if asynchronous and batch:
                return 0, eng.submit(batch)
            if batch:
                eng.transfer(batch).raise_for_errors()
        except KvcakeError as exc:
            log.error("transfer to %s failed: %s", target, exc)
            return -1, None
        return 0, None

    def transfer_sync(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        opcode: _Opcode,
        notify: TransferNotify | None = None,
        transport_hint: str = "",
    ) -> int:
        op = to_op(opcode)
        rc = self._run(target_hostname, [buffer], [peer_buffer_address], [length], op)[0]
        return self._notify(target_hostname, notify) if rc == 0 else rc

    def transfer_sync_write(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int:
        return self._run(target_hostname, [buffer], [peer_buffer_address], [length], Op.WRITE)[0]

    def transfer_sync_read(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int:
        return self._run(target_hostname, [buffer], [peer_buffer_address], [length], Op.READ)[0]

    def batch_transfer_sync(
        self,
        target_hostname: str,
        buffers: list[int],
        peer_buffer_addresses: list[int],
        lengths: list[int],
        opcode: _Opcode,
        notify: TransferNotify | None = None,
        transport_hint: str = "",
    ) -> int:
        op = to_op(opcode)
        rc = self._run(target_hostname, buffers, peer_buffer_addresses, lengths, op)[0]
        return self._notify(target_hostname, notify) if rc == 0 else rc

    def batch_transfer_sync_write(
        self,
        target_hostname: str,
        buffers: list[int],
        peer_buffer_addresses: list[int],
        lengths: list[int],
        transport_hint: str = "",
    ) -> int:
        return self._run(target_hostname, buffers, peer_buffer_addresses, lengths, Op.WRITE)[0]

    def batch_transfer_sync_read(
        self,
        target_hostname: str,
        buffers: list[int],
        peer_buffer_addresses: list[int],
        lengths: list[int],
        transport_hint: str = "",
    ) -> int:
        return self._run(target_hostname, buffers, peer_buffer_addresses, lengths, Op.READ)[0]

    def _async(
        self, target: str, bufs: list[int], peers: list[int], lengths: list[int], op: Op
    ) -> int:
        with self._lock:
            if len(self._batches) >= MAX_BATCHES:
                return 0
        rc, kv = self._run(target, bufs, peers, lengths, op, asynchronous=True)
        if rc != 0:
            return 0
        with self._lock:
            bid = next(self._ids)
            self._batches[bid] = (kv, 0)
        return bid

    def batch_transfer_async(
        self,
        target_hostname: str,
        buffers: list[int],
        peer_buffer_addresses: list[int],
        lengths: list[int],
        opcode: _Opcode,
        transport_hint: str = "",
    ) -> int:
        op = to_op(opcode)
        return self._async(target_hostname, buffers, peer_buffer_addresses, lengths, op)

    def batch_transfer_async_write(
        self,
        target_hostname: str,
        buffers: list[int],
        peer_buffer_addresses: list[int],
        lengths: list[int],
        transport_hint: str = "",
    ) -> int:
        return self._async(target_hostname, buffers, peer_buffer_addresses, lengths, Op.WRITE)

    def batch_transfer_async_read(
        self,
        target_hostname: str,
        buffers: list[int],
        peer_buffer_addresses: list[int],
        lengths: list[int],
        transport_hint: str = "",
    ) -> int:
        return self._async(target_hostname, buffers, peer_buffer_addresses, lengths, Op.READ)

    def _collect(self, bid: int, block: bool) -> int:
        """1 done, 0 pending, -1 failed or unknown; a finished batch id is freed."""
        with self._lock:
            entry = self._batches.get(bid)
        if entry is None or self._ep.engine is None:
            return -1
        kv, rc = entry
        if kv is not None:
            if not block and not self._ep.engine.status(kv).done:
                return 0
            rc = 0 if self._ep.engine.wait(kv).ok else -1
        with self._lock:
            self._batches.pop(bid, None)
        return 1 if rc == 0 else -1

    def get_batch_transfer_status(self, batch_ids: list[int]) -> int:
        results = [self._collect(b, block=True) for b in batch_ids]
        return 0 if all(r == 1 for r in results) else -1

    def transfer_submit_write(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int:
        bid = self._async(target_hostname, [buffer], [peer_buffer_address], [length], Op.WRITE)
        return bid if bid else -1

    def transfer_check_status(self, batch_id: int) -> int:
        return self._collect(batch_id, block=False)

    def _notify(self, target: str, notify: TransferNotify | None) -> int:
        if notify is None:
            return 0
        try:
            self._ep.peers.notify(target, notify.name, notify.msg)
        except KvcakeError as exc:
            log.error("notify %s: %s", target, exc)
            return -1
        return 0
