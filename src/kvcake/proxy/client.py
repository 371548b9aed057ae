"""Client stub of one instance: ``core.api.InstanceAPI`` over HTTP (the proxy's side of
:mod:`kvcake.serve.wire`). Connection failures become :class:`InstanceUnavailable`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeVar

import httpx

from kvcake.core.api import (
    InstanceAPI,
    KVEvent,
    KVReservation,
    LoadReport,
    PrefillResult,
    PrefillTask,
    Role,
    SamplingParams,
    TokenChunk,
)
from kvcake.core.ids import BlockHash, InstanceId, RequestId
from kvcake.serve.wire import (
    AbortAck,
    AbortRequest,
    InstanceError,
    InstanceInfo,
    InstanceState,
    InstanceUnavailable,
    ReserveKV,
    StreamRequest,
    client_auth,
    decode,
    encode,
    raise_for,
)

T = TypeVar("T")
_TRANSPORT_ERRORS = (httpx.TransportError, httpx.RemoteProtocolError)


class RemoteInstance(InstanceAPI):
    """Talks to one instance. ``info``/``state`` are refreshed by the proxy's poller; the
    ``InstanceAPI`` reads (``load_report``, ``kv_events``) answer from that cache."""

    def __init__(self, url: str, info: InstanceInfo, timeout_s: float = 600.0):
        self.url = url.rstrip("/")
        self.info = info
        self.instance_id: InstanceId = info.instance_id
        self.role: Role = info.role
        self.state: InstanceState | None = None
        self.alive = True
        self._http = httpx.AsyncClient(
            base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=5.0), auth=client_auth()
        )

    @classmethod
    async def connect(cls, url: str, timeout_s: float = 600.0) -> RemoteInstance:
        async with httpx.AsyncClient(timeout=5.0, auth=client_auth()) as http:
            try:
                r = await http.get(url.rstrip("/") + "/rpc/info")
            except _TRANSPORT_ERRORS as exc:
                raise InstanceUnavailable(f"{url}: {exc!r}") from exc
        if r.status_code != 200:
            raise_for(r.status_code, r.content, url)
        return cls(url, decode(r.content, InstanceInfo), timeout_s)

    async def close(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """A 200 response; anything else raises (unreachable = ``InstanceUnavailable``)."""
        try:
            r = await self._http.request(method, path, **kw)
        except _TRANSPORT_ERRORS as exc:
            raise InstanceUnavailable(
                f"{self.instance_id} unreachable: {exc!r}", self.instance_id
            ) from exc
        if r.status_code != 200:
            raise_for(r.status_code, r.content, str(self.instance_id), self.instance_id)
        return r

    async def _post(self, path: str, body: Any, tp: type[T], **kw: Any) -> T:
        r = await self._request("POST", path, content=encode(body), **kw)
        return decode(r.content, tp)

    async def fetch_state(self, since: int) -> InstanceState:
        r = await self._request("GET", "/rpc/state", params={"since": since}, timeout=5.0)
        self.state = decode(r.content, InstanceState)
        return self.state

    async def reserve_kv(
        self,
        request_id: RequestId,
        num_tokens: int,
        prompt_tokens: tuple[int, ...],
        block_hashes: tuple[BlockHash, ...],
        sampling: SamplingParams,
    ) -> KVReservation:
        """What a prefill instance asks of its decode peer (the proxy itself never reserves)."""
        body = ReserveKV(request_id, num_tokens, prompt_tokens, block_hashes, sampling)
        return await self._post("/rpc/reserve_kv", body, KVReservation)

    async def submit_prefill(self, task: PrefillTask) -> PrefillResult:
        return await self._post("/rpc/prefill", task, PrefillResult)

    async def stream_tokens(
        self, request_id: RequestId, first_token: int
    ) -> AsyncIterator[TokenChunk]:
        body = encode(StreamRequest(request_id, first_token))
        finished = False
        try:
            async with self._http.stream("POST", "/rpc/stream", content=body) as r:
                if r.status_code != 200:
                    raise_for(
                        r.status_code, await r.aread(), str(self.instance_id), self.instance_id
                    )
                async for line in r.aiter_lines():
                    if line:
                        chunk = decode(line, TokenChunk)
                        finished = chunk.finish_reason is not None
                        yield chunk
        except _TRANSPORT_ERRORS as exc:
            raise InstanceUnavailable(
                f"{self.instance_id} died mid-stream: {exc!r}", self.instance_id
            ) from exc
        if not finished:
            raise InstanceUnavailable(
                f"{self.instance_id} ended the stream without finishing", self.instance_id
            )

    async def abort(self, request_id: RequestId, writer_stopped: bool = False) -> bool:
        """Abort on this instance; True once it confirmed it writes nothing more for the
        request. An instance that cannot be reached answers False (a dead one frees everything
        anyway; a live but partitioned one fences the blocks)."""
        try:
            ack = await self._post(
                "/rpc/abort", AbortRequest(request_id, writer_stopped), AbortAck, timeout=90.0
            )
        except InstanceError:
            return False
        return ack.stopped

    async def kv_check(self) -> dict[str, int]:
        r = await self._request("GET", "/rpc/kv", timeout=5.0)
        return decode(r.content, dict)

    async def drain(self) -> None:
        await self._post("/rpc/drain", {}, dict)

    def load_report(self) -> LoadReport:
        if self.state is None:
            return LoadReport(self.instance_id, self.role, 0.0, healthy=self.alive)
        return self.state.load

    def kv_events(self, since_seq: int) -> list[KVEvent]:
        if self.state is None:
            return []
        return [e for e in self.state.events if e.seq > since_seq]
