"""``TransferEngine`` memory calls: registering regions (each a kvcake segment named
``{engine}/{base hex}``), Mooncake's managed buffers, and raw reads/writes by address."""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from kvcake.compat.mooncake._te_peers import Peers, Region, RegionTable, region_name
from kvcake.core.errors import KvcakeError

log = logging.getLogger(__name__)


def _view(addr: int, length: int) -> memoryview:
    return memoryview((ctypes.c_char * length).from_address(addr)).cast("B")


class MemoryMethods:
    _engine: Any
    _local: RegionTable
    _managed: dict[int, Any]
    _name: str
    _peers: Peers

    # --- memory -------------------------------------------------------------------------------

    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        if self._engine is None or buffer_addr <= 0 or capacity <= 0:
            return -1
        if self._local.find(buffer_addr, 1) is not None:
            return -1
        name = region_name(self._name, buffer_addr)
        try:
            self._engine.register_memory(name, _view(buffer_addr, capacity))
        except KvcakeError as exc:
            log.error("register_memory: %s", exc)
            return -1
        self._local.add(Region(buffer_addr, capacity, name))
        return 0

    def unregister_memory(self, buffer_addr: int) -> int:
        region = self._local.remove(buffer_addr)
        if region is None or self._engine is None:
            return -1
        self._engine.unregister(region.segment)
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
        if self._engine is None or length <= 0:
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
        if segment_name == self._name:
            first = self._local.first()
            return first.base if first is not None else 0
        try:
            return self._peers.first_address(segment_name)
        except KvcakeError:
            return 0

    def read_bytes_from_buffer(self, buffer_addr: int, length: int) -> bytes:
        return ctypes.string_at(buffer_addr, length)

    def write_bytes_to_buffer(self, buffer_addr: int, data: bytes, length: int) -> int:
        if length < 0 or length > len(data):
            return -1
        ctypes.memmove(buffer_addr, data, length)
        return 0
