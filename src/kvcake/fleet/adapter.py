"""kvcake's proxy in front of a fleet of vLLM engines (docs/integrations/vllm.md).

A vLLM engine is not a kvcake instance, so this adapter gives the conductor what it needs:

* **what each engine holds** — its KV events (``--kv-events-config``, zmq), re-hashed with
  kvcake's chained hash (:mod:`kvcake.fleet.index`); the pool's blocks from the store
  master's events (:mod:`kvcake.proxy.pool_events`, holder ``pool``);
* **load** — each engine's ``/metrics`` (``vllm:num_requests_running``, ``…waiting``,
  ``…kv_cache_usage_perc``) plus the prefills this proxy dispatched and has not seen finish;
* **placement** — the same ``Conductor.schedule`` as the simulator, on a
  :class:`~kvcake.core.api.ClusterSnapshot`: colocated when every engine is ``both`` (kv_both:
  an engine prefills and decodes its requests), disaggregated when the fleet has ``prefill``
  and ``decode`` engines (the prefill candidates are the prefill and both engines, the decode
  candidates the decode and both engines; :mod:`kvcake.fleet.pd` runs the two steps).

Colocated requests are forwarded unchanged over vLLM's OpenAI HTTP API (streamed through when
asked); the answer carries ``x-kvcake-engine``. Text and chat prompts are tokenized by an engine's
``/tokenize`` (the engine's own chat template, so the proxy's block names match the engine's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field, replace

import httpx
import zmq
import zmq.asyncio

from kvcake.conductor.conductor import Conductor
from kvcake.conductor.config import ConductorConfig
from kvcake.conductor.index import PrefixIndex
from kvcake.conductor.predictors import Predictors, PrefillTimeModel
from kvcake.core import promtext
from kvcake.core.api import Accept, ClusterSnapshot, DecodeState, PrefillState, RequestView
from kvcake.core.config import setting
from kvcake.core.costmodel import PrefillCoefficients
from kvcake.core.hashing import block_hashes
from kvcake.core.ids import InstanceId, RequestId
from kvcake.fleet.index import EngineEvents
from kvcake.proxy import pool_events
from kvcake.serve.online_fit import OnlineFit

log = logging.getLogger(__name__)

ROLES = ("both", "prefill", "decode")  # an engine's part in the fleet (its connector kv_role)
PREFILLS, DECODES = ("both", "prefill"), ("both", "decode")


@dataclass
class EngineRef:
    id: InstanceId
    url: str
    events: str = ""  # tcp://127.0.0.1:PORT the proxy binds for its KV events ("" = none)
    role: str = "both"  # ROLES: both = prefills and decodes; prefill / decode = P/D only
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    healthy: bool = False
    pending_s: float = 0.0  # predicted prefill seconds dispatched here, not yet answered
    pending: int = 0
    generated: float = 0.0  # vLLM's generation-token counter: a non-streamed decode's progress
    progress_at: float = 0.0  # monotonic time the counter last moved (or the engine came up)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"engine {self.id}: role must be one of {ROLES}, got {self.role!r}")


@dataclass(frozen=True)
class Placement:
    """Where one request runs: ``prefill is decode`` = colocated (one engine does both)."""

    prefill: EngineRef
    decode: EngineRef
    predicted_s: float  # the prefill's predicted seconds (booked on the prefill engine)
    tokens: int = 0
    cached: int = 0  # prompt tokens the engine held when it was chosen (a local prefix hit)
    # Its time to first token measures the engine's prefill alone: no prefill of ours was
    # booked on the engine and nothing is fetched from the pool first.
    clean: bool = False
    started: float = 0.0  # time.monotonic() at the booking

    @property
    def disaggregated(self) -> bool:
        return self.prefill.id != self.decode.id


WANT = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:generation_tokens_total",
)


def parse_metrics(text: str) -> dict[str, float]:
    """Sums of the vLLM series the adapter reads (all label sets); ``ValueError`` when ``text``
    is not Prometheus text."""
    series = promtext.parse_metrics(text)
    return {name: promtext.total(series, name) for name in WANT}


@dataclass
class FleetConfig:
    block_tokens: int = setting(32, "vLLM's --block-size (tokens per KV block)")
    kv_capacity_tokens: int = 23_296  # per engine (vLLM logs "CPU KV cache size")
    kv_bytes_per_token: int = 46_080  # SmolLM2-135M fp32: 30 layers x 2 x 3 x 64 x 4
    link_bandwidth: float = 2e9  # pool -> engine, bytes/s (same host)
    poll_interval_s: float = 0.5
    model: str = "smollm2"
    prefill_timeout_s: float = setting(
        300.0, "P/D: the prefill step's (max_tokens=1) deadline (then a 504)"
    )
    # A stalled engine ends the request with an error instead of holding it for the client's
    # 600 s.
    decode_idle_timeout_s: float = setting(
        60.0,
        "P/D decode: the longest wait for the engine's next chunk (streamed) or for its token "
        "counter to move (non-streamed); then the request ends with an error",
    )
    conductor: ConductorConfig = field(default_factory=lambda: ConductorConfig(colocated=True))


class VllmFleet:
    """Live view of the engines and the placement decision. Run :meth:`run` on the loop."""

    def __init__(self, engines: list[EngineRef], cfg: FleetConfig, master: str = ""):
        if not engines:
            raise ValueError("a fleet needs at least one engine")
        if len({e.id for e in engines}) != len(engines):
            raise ValueError("engine ids must be unique")
        self.pd = any(e.role != "both" for e in engines)
        if self.pd:
            if not any(e.role in PREFILLS for e in engines):
                raise ValueError("a P/D fleet needs a prefill (or both) engine")
            if not any(e.role in DECODES for e in engines):
                raise ValueError("a P/D fleet needs a decode (or both) engine")
            cfg = replace(cfg, conductor=replace(cfg.conductor, colocated=False))
        self.engines = {e.id: e for e in engines}
        self.cfg = cfg
        self.master = master
        self.index = PrefixIndex()
        self.events = {
            e.id: EngineEvents(self.index, e.id, cfg.block_tokens, cfg.kv_capacity_tokens)
            for e in engines
        }
        # Seeded with kvcake's CPU preset, then fitted online to what these engines take (a
        # vLLM engine on another machine may prefill several times faster than the preset):
        # queues and prefills must be priced like the pool fetches they are weighed against.
        self.predictors = Predictors.from_preset("smollm2-135m/cpu")
        self.fit = OnlineFit(
            self.predictors.prefill.coefficients, self.predictors.decode.coefficients
        )
        self.conductor = Conductor(cfg.conductor, self.predictors)
        self.t0 = time.monotonic()
        self.placed: dict[InstanceId, int] = dict.fromkeys(self.engines, 0)
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(600, connect=5))

    def ready(self) -> bool:
        """Some engine can serve: a healthy engine, and on a P/D fleet a healthy prefill-capable
        and a healthy decode-capable one."""
        up = [e for e in self.engines.values() if e.healthy]
        if not self.pd:
            return bool(up)
        return any(e.role in PREFILLS for e in up) and any(e.role in DECODES for e in up)

    # --- state ----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(self._poll(stop))]
        tasks += [
            asyncio.create_task(self._events(e, stop)) for e in self.engines.values() if e.events
        ]
        if self.master:
            pool_events.start(self.index, self.master, stop)
        await stop.wait()
        for t in tasks:
            t.cancel()
        await self.http.aclose()

    async def _poll(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.gather(*(self.poll_one(e) for e in self.engines.values()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.cfg.poll_interval_s)

    async def poll_one(self, e: EngineRef) -> None:
        try:
            r = await self.http.get(e.url + "/metrics", timeout=3)
            r.raise_for_status()
        except httpx.HTTPError:
            if e.healthy:
                log.warning("vLLM engine %s at %s stopped answering", e.id, e.url)
            e.healthy = False
            return
        try:
            m = parse_metrics(r.text)
        except ValueError as exc:  # not Prometheus text: this scrape tells nothing
            log.warning("vLLM engine %s: unreadable /metrics (%s)", e.id, exc)
            return
        e.running = m["vllm:num_requests_running"]
        e.waiting = m["vllm:num_requests_waiting"]
        e.kv_usage = m["vllm:kv_cache_usage_perc"]
        if m["vllm:generation_tokens_total"] != e.generated or not e.healthy:
            e.generated, e.progress_at = m["vllm:generation_tokens_total"], time.monotonic()
        e.healthy = True

    async def _events(self, e: EngineRef, stop: asyncio.Event) -> None:
        sock = zmq.asyncio.Context.instance().socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        # vLLM *connects* its PUB to a tcp://host:port endpoint (it binds only "*" or ipc://),
        # so the proxy binds: loopback only, and engines may start before or after it.
        sock.bind(e.events)
        try:
            while not stop.is_set():
                if not await sock.poll(500):
                    continue
                frames = await sock.recv_multipart()
                self.events[e.id].apply(frames[-1])  # [topic, seq, payload]
        finally:
            sock.close(0)

    def snapshot(self) -> ClusterSnapshot:
        es = list(self.engines.values())
        cap = self.cfg.kv_capacity_tokens
        return ClusterSnapshot(
            now_s=time.monotonic() - self.t0,
            prefill=tuple(
                PrefillState(e.id, e.pending_s, e.pending + int(e.waiting), healthy=e.healthy)
                for e in es
                if e.role in PREFILLS
            ),
            decode=tuple(
                DecodeState(e.id, int(e.running), int(e.kv_usage * cap), cap, healthy=e.healthy)
                for e in es
                if e.role in DECODES
            ),
            kv_index=self.index,
            block_tokens=self.cfg.block_tokens,
            kv_bytes_per_token=self.cfg.kv_bytes_per_token,
            link_bandwidth=self.cfg.link_bandwidth,
        )

    def place(self, request_id: str, tokens: list[int], max_tokens: int) -> Accept | None:
        hashes = tuple(block_hashes(tokens, self.cfg.block_tokens))
        view = RequestView(RequestId(request_id), time.monotonic() - self.t0, len(tokens), hashes,
                           expected_output=max_tokens)  # fmt: skip
        decision = self.conductor.schedule(view, self.snapshot())
        return decision if isinstance(decision, Accept) else None

    def done(self, request_id: str, engine: InstanceId, predicted_s: float) -> None:
        """Colocated: the request's engine answered (its prefill is over)."""
        self.prefill_done(request_id, engine, predicted_s)
        self.conductor.on_decode_done(RequestId(request_id), time.monotonic() - self.t0)

    def prefill_done(self, request_id: str, engine: InstanceId, predicted_s: float) -> None:
        e = self.engines[engine]
        e.pending_s = max(0.0, e.pending_s - predicted_s)
        e.pending = max(0, e.pending - 1)
        self.conductor.on_prefill_done(RequestId(request_id), time.monotonic() - self.t0)

    def finished(self, request_id: str, ok: bool = True) -> None:
        """P/D: the decode step ended (``ok``) or the request was given up."""
        if ok:
            self.conductor.on_decode_done(RequestId(request_id), time.monotonic() - self.t0)
        else:
            self.conductor.on_abort(RequestId(request_id))

    def dispatch(
        self, request_id: str, tokens: list[int], max_tokens: int
    ) -> tuple[EngineRef, float]:
        """Colocated placement (the engine that prefills): see :meth:`plan`."""
        p = self.plan(request_id, tokens, max_tokens)
        return p.prefill, p.predicted_s

    def plan(self, request_id: str, tokens: list[int], max_tokens: int) -> Placement:
        """Choose the prefill and decode engines (the conductor; the least loaded healthy
        ones if it rejects) and book the prefill. Raises LookupError when no engine can."""
        acc = self.place(request_id, tokens, max_tokens)
        if acc is not None:
            p, d = self.engines[acc.prefill], self.engines[acc.decode]
            cached = acc.local_prefix_blocks * self.cfg.block_tokens
        else:
            p = self._least_loaded_prefill()
            nd = p if not self.pd else self.next_decode(set(), prefer_not=p.id)
            if nd is None:
                raise LookupError("no healthy vLLM decode engine")
            d, cached = nd, 0
        cached = min(cached, len(tokens))
        clean = p.pending == 0 and not (acc is not None and acc.fetch)
        predicted = self.predictors.prefill.time(len(tokens), cached)
        p.pending_s += predicted
        p.pending += 1
        self.placed[p.id] += 1
        return Placement(p, d, predicted, len(tokens), cached, clean, time.monotonic())

    def observe_prefill(self, p: Placement, seconds: float) -> None:
        """The first token of a colocated placement came ``seconds`` after its booking: a
        sample of the engines' prefill speed when the placement was clean (no queue of ours,
        no pool fetch). The conductor predicts with the refitted coefficients at once."""
        if not p.clean or p.disaggregated or seconds <= 0:
            return
        self.fit.add_prefill(p.tokens, p.cached, seconds)
        f = self.fit.fitted()
        model = PrefillTimeModel(PrefillCoefficients(*f.prefill), f.prefill_error)
        self.predictors = Predictors(model, self.predictors.transfer, self.predictors.decode)
        self.conductor.set_predictors(self.predictors)

    def _least_loaded_prefill(self) -> EngineRef:
        healthy = [e for e in self.engines.values() if e.healthy and e.role in PREFILLS]
        if not healthy:
            raise LookupError("no healthy vLLM engine" + (" to prefill on" if self.pd else ""))
        return min(healthy, key=lambda x: x.pending_s)

    def next_decode(self, tried: set[InstanceId], prefer_not: InstanceId | None = None
                    ) -> EngineRef | None:  # fmt: skip
        """The least busy healthy decode-capable engine not in ``tried`` (a P/D decode rather
        than ``prefer_not``, the prefill's engine), or None."""
        ok = [e for e in self.engines.values()
              if e.healthy and e.role in DECODES and e.id not in tried]  # fmt: skip
        if not ok:
            return None
        return min(ok, key=lambda x: (x.id == prefer_not, x.running + x.waiting))
