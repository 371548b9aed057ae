"""kvcake's ``mooncake.engine``: Mooncake 0.3.13's ``TransferEngine`` Python API over
:class:`kvcake.transfer.TransferEngine` (addressing: :mod:`._te_peers`).

Return conventions are Mooncake's: 0 / -1 for sync calls, a batch id (0 on failure) for async
batches, ``get_batch_transfer_status`` blocking to 0 / -1, ``transfer_check_status`` 1 done,
0 pending, -1 failed. Left out (no meaning without their hardware or C++ runtime):
``get_engine`` / ``get_engine_ptr`` (the C++ object), the RPC interfaces, ``SharedSegment``."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import weakref

from kvcake.compat.mooncake._metadata import check_metadata_server
from kvcake.compat.mooncake._te_memory import Endpoint, EngineMemory
from kvcake.compat.mooncake._te_peers import Peers, RegionTable, take_notifies
from kvcake.compat.mooncake._te_transfers import Transfers
from kvcake.compat.mooncake._te_types import Read, TransferNotify, TransferOpcode, Write, _Opcode
from kvcake.core.errors import KvcakeError
from kvcake.core.via import Via
from kvcake.transfer import DirectoryService, MemoryBackend
from kvcake.transfer import TransferEngine as _KvEngine

log = logging.getLogger(__name__)
SUPPORT_CUDA = SUPPORT_EFA = SUPPORT_HIP = SUPPORT_MUSA = False
SUPPORT_INTRA_NVLINK = SUPPORT_MNNVL = False
PEER_UNREACHABLE = -102  # what the wheel's send_probe answers for a peer that is not there
_LIVE: weakref.WeakSet[TransferEngine] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Mooncake's engine has no close(): stop every engine at exit, each before its directory."""
    for engine in list(_LIVE):
        with contextlib.suppress(Exception):
            engine._close()


class TransferEngine:
    """Mooncake's ``TransferEngine`` over kvcake's, composed of two parts sharing the
    ``Endpoint`` (the kvcake engine, the segment name, the registered regions, the peers):
    ``EngineMemory`` (registration, managed buffers, raw buffer access) and ``Transfers``
    (sync / async transfers, batch status). Their methods are the engine's (``Via``); the
    engine itself owns the lifecycle (its directory service and kvcake engine), notifications
    and probes. Thread safety: the parts' (async batches under a lock); initialize must not
    race other calls. The caller owns the memory behind every address it passes."""

    TransferOpcode: type[_Opcode] = TransferOpcode

    def __init__(self) -> None:
        self._dir: DirectoryService | None = None
        self._backend = MemoryBackend()
        self._ep = Endpoint(RegionTable(), Peers(self._backend))
        self._memory = EngineMemory(self._ep)
        self._transfers = Transfers(self._ep)
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
        if self._ep.engine is not None:
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
            self._ep.engine = _KvEngine(self._dir.address, host, (host,), proto)
        except (OSError, ValueError, KvcakeError) as exc:
            log.error("initialize: %s", exc)
            self._close()
            return -1
        self._ep.name = f"{host}:{self.get_rpc_port()}"
        return 0

    def get_rpc_port(self) -> int:
        return int(self._dir.address.rsplit(":", 1)[1]) if self._dir is not None else 0

    def _close(self) -> None:
        self._ep.peers.close()
        if self._ep.engine is not None:
            self._ep.engine.close()
            self._ep.engine = None
        if self._dir is not None:
            self._dir.stop()
            self._dir = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._close()

    def get_local_topology(self, device_name: str | None = None) -> str:
        addrs = self._ep.engine.addresses if self._ep.engine is not None else []
        return json.dumps({"cpu:0": {"tcp": addrs, "rdma": []}})

    # --- memory (EngineMemory) ---------------------------------------------------------------
    register_memory = Via("_memory", EngineMemory.register_memory)
    unregister_memory = Via("_memory", EngineMemory.unregister_memory)
    batch_register_memory = Via("_memory", EngineMemory.batch_register_memory)
    batch_unregister_memory = Via("_memory", EngineMemory.batch_unregister_memory)
    allocate_managed_buffer = Via("_memory", EngineMemory.allocate_managed_buffer)
    free_managed_buffer = Via("_memory", EngineMemory.free_managed_buffer)
    get_first_buffer_address = Via("_memory", EngineMemory.get_first_buffer_address)
    read_bytes_from_buffer = Via("_memory", EngineMemory.read_bytes_from_buffer)
    write_bytes_to_buffer = Via("_memory", EngineMemory.write_bytes_to_buffer)

    # --- transfers (Transfers) ---------------------------------------------------------------
    transfer_sync = Via("_transfers", Transfers.transfer_sync)
    transfer_sync_write = Via("_transfers", Transfers.transfer_sync_write)
    transfer_sync_read = Via("_transfers", Transfers.transfer_sync_read)
    batch_transfer_sync = Via("_transfers", Transfers.batch_transfer_sync)
    batch_transfer_sync_write = Via("_transfers", Transfers.batch_transfer_sync_write)
    batch_transfer_sync_read = Via("_transfers", Transfers.batch_transfer_sync_read)
    batch_transfer_async = Via("_transfers", Transfers.batch_transfer_async)
    batch_transfer_async_write = Via("_transfers", Transfers.batch_transfer_async_write)
    batch_transfer_async_read = Via("_transfers", Transfers.batch_transfer_async_read)
    get_batch_transfer_status = Via("_transfers", Transfers.get_batch_transfer_status)
    transfer_submit_write = Via("_transfers", Transfers.transfer_submit_write)
    transfer_check_status = Via("_transfers", Transfers.transfer_check_status)

    # --- notifications and probes -------------------------------------------------------------

    def get_notifies(self) -> list[TransferNotify]:
        return [TransferNotify(n, m) for n, m in take_notifies(self._backend)]

    def send_probe(self, peer_server_name: str) -> int:
        try:
            self._ep.peers.client(peer_server_name).list()
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
