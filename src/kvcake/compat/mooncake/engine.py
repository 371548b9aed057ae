"""kvcake's ``mooncake.engine``: Mooncake 0.3.13's ``TransferEngine`` Python API over
:class:`kvcake.transfer.TransferEngine` (addressing: :mod:`._te_peers`).

Return conventions are Mooncake's: 0 / -1 for sync calls, a batch id (0 on failure) for async
batches, ``get_batch_transfer_status`` blocking to 0 / -1, ``transfer_check_status`` 1 done,
0 pending, -1 failed. Left out (no meaning without their hardware or C++ runtime):
``get_engine`` / ``get_engine_ptr`` (the C++ object), the RPC interfaces, ``SharedSegment``."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import json
import logging
import os
import threading
import weakref
from enum import IntEnum

from kvcake.compat.mooncake._metadata import check_metadata_server
from kvcake.compat.mooncake._te_memory import MemoryMethods, _view
from kvcake.compat.mooncake._te_peers import Peers, RegionTable, take_notifies
from kvcake.core.errors import KvcakeError
from kvcake.core.ids import BatchId, SegmentName
from kvcake.transfer import DirectoryService, MemoryBackend, Op, TransferRequest
from kvcake.transfer import TransferEngine as _KvEngine

log = logging.getLogger(__name__)
SUPPORT_CUDA = SUPPORT_EFA = SUPPORT_HIP = SUPPORT_MUSA = False
SUPPORT_INTRA_NVLINK = SUPPORT_MNNVL = False
MAX_BATCHES = 4096  # outstanding async batches per engine
PEER_UNREACHABLE = -102  # what the wheel's send_probe answers for a peer that is not there
_LIVE: weakref.WeakSet[TransferEngine] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Mooncake's engine has no close(): stop every engine at exit, each before its directory."""
    for engine in list(_LIVE):
        with contextlib.suppress(Exception):
            engine._close()


class TransferOpcode(IntEnum):
    Read = 0
    Write = 1

    def __str__(self) -> str:
        return f"TransferOpcode.{self.name}"


Read, Write = TransferOpcode.Read, TransferOpcode.Write
_Opcode = TransferOpcode


def _op(opcode: _Opcode) -> Op:
    """Mooncake's opcode (enum or int) as the Transfer Engine's operation."""
    return Op.WRITE if TransferOpcode(opcode) is TransferOpcode.Write else Op.READ


class TransferNotify:
    def __init__(self, name: str = "", msg: str = ""):
        self.name, self.msg = name, msg

    def __repr__(self) -> str:
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"


class TransferEngine(MemoryMethods):
    TransferOpcode: type[_Opcode] = TransferOpcode

    def __init__(self) -> None:
        self._engine: _KvEngine | None = None
        self._dir: DirectoryService | None = None
        self._backend = MemoryBackend()
        self._peers = Peers(self._backend)
        self._local = RegionTable()
        self._managed: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self._name = ""
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._batches: dict[int, tuple[BatchId | None, int]] = {}  # id -> (kvcake batch, rc)
        _LIVE.add(self)

    # --- lifecycle ----------------------------------------------------------------------------

    def initialize(
        self, local_hostname: str, metadata_server: str, protocol: str, device_name: str
    ) -> int:
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, "")

    def initialize_ext(
        self,
        local_hostname: str,
        metadata_server: str,
        protocol: str,
        device_name: str,
        metadata_type: str,
    ) -> int:
        if self._engine is not None:
            return -1
        proto = {"tcp": "tcp", "auto": "auto", "shm": "shm"}.get(protocol)
        if proto is None or check_metadata_server(metadata_server):
            log.error("initialize: protocol %r / metadata %r not usable", protocol, metadata_server)
            return -1
        host, _, port = local_hostname.partition(":")
        host = host or "127.0.0.1"
        if not os.environ.get("MC_LEGACY_RPC_PORT_BINDING"):
            port = ""  # as Mooncake: the rpc port is picked freely unless legacy binding is asked
        try:
            self._dir = DirectoryService(host, int(port or 0), backend=self._backend)
            self._dir.start()
            self._engine = _KvEngine(self._dir.address, host, (host,), proto)
        except (OSError, ValueError, KvcakeError) as exc:
            log.error("initialize: %s", exc)
            self._close()
            return -1
        self._name = f"{host}:{self.get_rpc_port()}"
        return 0

    def get_rpc_port(self) -> int:
        return int(self._dir.address.rsplit(":", 1)[1]) if self._dir is not None else 0

    def _close(self) -> None:
        self._peers.close()
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        if self._dir is not None:
            self._dir.stop()
            self._dir = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._close()

    def get_local_topology(self, device_name: str | None = None) -> str:
        addrs = self._engine.addresses if self._engine is not None else []
        return json.dumps({"cpu:0": {"tcp": addrs, "rdma": []}})

    # --- transfers ----------------------------------------------------------------------------

    def _request(
        self, target: str, local: int, remote: int, length: int, op: Op
    ) -> TransferRequest | tuple[Op, memoryview, str, int]:
        """A registered-local request for a kvcake batch, or (op, view, segment, offset) for a
        local buffer that was never registered (copied with write/read_into)."""
        if length <= 0:
            raise KvcakeError(f"length must be > 0, got {length}")
        peer = self._local.find(remote, length) if target == self._name else None
        region = peer or self._peers.locate(target, remote, length)
        off = remote - region.base
        mine = self._local.find(local, length)
        if mine is None:
            return (op, _view(local, length), region.segment, off)
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
        eng = self._engine
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
        op = _op(opcode)
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
        op = _op(opcode)
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
        op = _op(opcode)
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
        if entry is None or self._engine is None:
            return -1
        kv, rc = entry
        if kv is not None:
            if not block and not self._engine.status(kv).done:
                return 0
            rc = 0 if self._engine.wait(kv).ok else -1
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

    # --- notifications and probes -------------------------------------------------------------

    def _notify(self, target: str, notify: TransferNotify | None) -> int:
        if notify is None:
            return 0
        try:
            self._peers.notify(target, notify.name, notify.msg)
        except KvcakeError as exc:
            log.error("notify %s: %s", target, exc)
            return -1
        return 0

    def get_notifies(self) -> list[TransferNotify]:
        return [TransferNotify(n, m) for n, m in take_notifies(self._backend)]

    def send_probe(self, peer_server_name: str) -> int:
        try:
            self._peers.client(peer_server_name).list()
        except KvcakeError:
            return PEER_UNREACHABLE
        return 0

    def warmup_efa_segment(self, segment_name: str) -> int:
        """EFA only: nothing to warm up over TCP or shared memory."""
        return 0


__all__ = [
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_MNNVL",
    "SUPPORT_MUSA",
    "Read",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
    "Write",
]  # fmt: skip
