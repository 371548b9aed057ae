"""The master's table of clients (part of :class:`~kvcake.store.master_state.MasterState`).

Invariants: called with the state lock held; owns ``clients`` (one entry per client seen, with
the segments it mounted) and ``rejoin`` (clients known from a replayed log that must mount
again before they count as known: empty on a master that did not replay).
"""

from __future__ import annotations

from collections.abc import Callable

from kvcake.core.ids import ClientId
from kvcake.store.metadata import ClientInfo
from kvcake.store.protocol import FORGOTTEN, REMOUNT


class ClientTable:
    def __init__(self, clock: Callable[[], float], ttl_s: float):
        self.clock = clock
        self.ttl_s = ttl_s
        self.clients: dict[ClientId, ClientInfo] = {}
        self.rejoin: set[ClientId] = set()

    def touch(self, client: ClientId, host: str) -> bool:
        """Record a sign of life; False when the client was unknown or must remount."""
        return not self.heard(client, host)

    def heard(self, client: ClientId, host: str) -> int:
        """Record a heartbeat; what it must do: 0, or ``protocol.REMOUNT`` (a client this
        master replayed, ``rejoin``), or ``protocol.FORGOTTEN`` (one it never knew: nothing of
        it is left here)."""
        info = self.clients.get(client)
        if info is None:
            self.clients[client] = ClientInfo(client, host, self.clock())
            return FORGOTTEN
        info.last_seen = self.clock()
        return REMOUNT if client in self.rejoin else 0

    def expired(self, client: ClientId) -> bool:
        """A known client silent for longer than the TTL (not yet expired by housekeeping)."""
        info = self.clients.get(client)
        return info is not None and info.last_seen < self.clock() - self.ttl_s

    def silent(self) -> list[ClientId]:
        """Every client silent for longer than the TTL."""
        deadline = self.clock() - self.ttl_s
        return [c for c, info in self.clients.items() if info.last_seen < deadline]
