"""``TransferEngine``'s shared endpoint state and its memory part: registering regions (each a
kvcake segment named ``{engine}/{base hex}``), Mooncake's managed buffers, and raw reads/writes
by address."""

from __future__ import annotations

import ctypes
import logging

from kvcake.compat.mooncake._te_peers import Peers, Region, RegionTable, region_name
from kvcake.core.errors import KvcakeError
from kvcake.transfer import TransferEngine as KvEngine

log = logging.getLogger(__name__)


def view(addr: int, length: int) -> memoryview:
    return memoryview((ctypes.c_char * length).from_address(addr)).cast("B")


class Endpoint:
    """What ``initialize`` made, shared by the engine's parts: the kvcake Transfer Engine
    (``None`` before initialize and after close), this engine's segment name (``host:rpc
    port``), the regions registered here and the peers reached. Thread safety: the region
    table's and the kvcake engine's; initialize and close must not race other calls."""

    def __init__(self, local: RegionTable, peers: Peers) -> None:
        self.engine: KvEngine | None = None
        self.name = ""
        self.local = local
        self.peers = peers


class EngineMemory:
    """Registered regions and managed buffers. The caller owns the memory it registers (and
    keeps it valid until unregistered); the part owns the managed buffers it allocates until
    ``free_managed_buffer``."""

    def __init__(self, ep: Endpoint) -> None:
        self._ep = ep
        self._managed: dict[int, ctypes.Array[ctypes.c_char]] = {}

    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        if self._ep.engine is None or buffer_addr <= 0 or capacity <= 0:
            return -1
        if self._ep.local.find(buffer_addr, 1) is not None:
            return -1
        name = region_name(self._ep.name, buffer_addr)
        try:
            self._ep.engine.register_memory(name, view(buffer_addr, capacity))
        except KvcakeError as exc:
            log.error("register_memory: %s", exc)
            return -1
        self._ep.local.add(Region(buffer_addr, capacity, name))
        return 0

    def unregister_memory(self, buffer_addr: int) -> int:
        region = self._ep.local.remove(buffer_addr)
        if region is None or self._ep.engine is None:
            return -1
        self._ep.engine.unregister(region.segment)
        return 0

    def batch_register_memory(
        self, buffer_addresses: list[int], capacities: list[int], location: str = "*"
    ) -> int:
        if len(buffer_addresses) != len(capacities):
            return -1
        rcs = [
            self.register_memory(a, c, location)
            for a, c in zip(buffer_addresses, capacities, strict=True)
        ]
        return min(rcs, default=0)

    def batch_unregister_memory(self, buffer_addresses: list[int]) -> int:
        return min((self.unregister_memory(a) for a in buffer_addresses), default=0)

    def allocate_managed_buffer(self, length: int) -> int:
        if self._ep.engine is None or length <= 0:
            return 0
        buf = (ctypes.c_char * length)()
        addr = ctypes.addressof(buf)
        if self.register_memory(addr, length) != 0:
            return 0
        self._managed[addr] = buf
        return addr

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        if buffer_addr not in self._managed:
            return 0  # the wheel answers 0 for a buffer it does not (or no longer) manage
        self.unregister_memory(buffer_addr)
        del self._managed[buffer_addr]
        return 0

    def get_first_buffer_address(self, segment_name: str) -> int:
        if segment_name == self._ep.name:
            first = self._ep.local.first()
            return first.base if first is not None else 0
        try:
            return self._ep.peers.first_address(segment_name)
        except KvcakeError:
            return 0

    def read_bytes_from_buffer(self, buffer_addr: int, length: int) -> bytes:
        return ctypes.string_at(buffer_addr, length)

    def write_bytes_to_buffer(self, buffer_addr: int, data: bytes, length: int) -> int:
        if length < 0 or length > len(data):
            return -1
        ctypes.memmove(buffer_addr, data, length)
        return 0
