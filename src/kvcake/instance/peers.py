"""A prefill instance's calls to its decode peers: the KV reservation, asked for directly.

The prefill instance reserves the decode KV itself (``POST /rpc/reserve_kv`` at the
``core.api.DecodeTarget`` the proxy named), handing the prompt over in the same call: the
reservation goes from the decode instance to the one that writes into it, and the prompt
reaches the decode instance without the proxy sending it a second time.

A full decode KV memory is waited for (retried) up to the target's ``wait_s``, then ``kv_full``
goes back to the proxy (a 429 ``no_capacity`` there); an unreachable decode instance is an
:class:`~kvcake.serve.wire.InstanceUnavailable` naming it, so the proxy marks it dead and
re-places the request, as when it reserved itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import httpx

from kvcake.core.api import DecodeTarget, KVReservation
from kvcake.serve.wire import (
    InstanceError,
    InstanceUnavailable,
    ReserveKV,
    client_auth,
    decode,
    encode,
    raise_for,
)

RETRY_S = 0.05  # between reservation attempts while the decode KV is full


class Peers(Protocol):
    """Reaches decode instances (HTTP here; tests in one process call them directly)."""

    async def reserve(self, target: DecodeTarget, req: ReserveKV) -> KVReservation: ...


class HttpPeers:
    """One HTTP client per decode peer, at most ``max_peers`` (the least recently used one is
    closed when a new peer appears)."""

    def __init__(self, max_peers: int = 64, timeout_s: float = 30.0):
        self.max_peers = max_peers
        self.timeout = httpx.Timeout(timeout_s, connect=5.0)
        self._clients: OrderedDict[str, httpx.AsyncClient] = OrderedDict()

    async def reserve(self, target: DecodeTarget, req: ReserveKV) -> KVReservation:
        http = await self._client(target.url)
        iid = str(target.instance_id)
        try:
            r = await http.post("/rpc/reserve_kv", content=encode(req))
        except (httpx.TransportError, httpx.RemoteProtocolError) as exc:
            raise InstanceUnavailable(f"{iid} unreachable: {exc!r}", iid) from exc
        if r.status_code != 200:
            raise_for(r.status_code, r.content, iid, iid)
        return decode(r.content, KVReservation)

    async def _client(self, url: str) -> httpx.AsyncClient:
        http = self._clients.pop(url, None)
        if http is None:
            http = httpx.AsyncClient(base_url=url, timeout=self.timeout, auth=client_auth())
            if len(self._clients) >= self.max_peers:
                await self._clients.popitem(last=False)[1].aclose()
        self._clients[url] = http
        return http


async def reserve_waiting(
    peers: Peers, target: DecodeTarget, req: ReserveKV, stop: Callable[[], bool]
) -> tuple[KVReservation, float]:
    """Reserve, retrying while the decode KV is full (up to ``target.wait_s``) unless ``stop()``
    (the request was aborted). Returns the reservation and the seconds waited for it."""
    t0 = time.monotonic()
    while True:
        if stop():
            raise InstanceError(f"request {req.request_id} was aborted", 409, "aborted")
        try:
            return await peers.reserve(target, req), time.monotonic() - t0
        except InstanceError as exc:
            if exc.kind != "kv_full" or time.monotonic() - t0 > target.wait_s:
                raise
        await asyncio.sleep(RETRY_S)


class PendingReservation:
    """A reservation being asked for on the event loop while the prefill thread already reads
    its prefix and computes: the thread blocks on it (:meth:`get`) only when it writes its first
    KV, so the round trip to the decode instance (and its parsing of the prompt) overlaps the
    prefill's own work instead of preceding it. ``blocked_s``: how long the thread waited."""

    def __init__(self, task: asyncio.Future[tuple[KVReservation, float]], timeout_s: float):
        self.timeout_s = timeout_s
        self.blocked_s = 0.0
        self._cf: concurrent.futures.Future[KVReservation] = concurrent.futures.Future()
        task.add_done_callback(self._copy)

    def _copy(self, task: asyncio.Future[tuple[KVReservation, float]]) -> None:
        if task.cancelled():
            self._cf.set_exception(InstanceError("the reservation was cancelled", 409, "aborted"))
        elif (exc := task.exception()) is not None:
            self._cf.set_exception(exc)
        else:
            self._cf.set_result(task.result()[0])

    def get(self) -> KVReservation:
        """On the prefill thread: the reservation (raises what asking for it raised)."""
        t0 = time.perf_counter()
        try:
            return self._cf.result(self.timeout_s)
        except concurrent.futures.TimeoutError as exc:
            raise InstanceError("no answer to the decode KV reservation", 504) from exc
        finally:
            self.blocked_s += time.perf_counter() - t0
