"""Live conductor state: the proxy's view of the cluster, kept current from the instances'
load reports and KV events (pulled every ``poll_interval_s``).

Invariants: an instance that stops answering is marked dead at once, its blocks leave the KV
index and it appears in snapshots as unhealthy (so the conductor stops routing to it); when it
answers again its whole cache is re-read (``since=-1``). Event sequence gaps also trigger a full
re-read, so the index never silently drifts from what instances hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from kvcake.conductor.index import PrefixIndex
from kvcake.conductor.predictors import DecodeTBTModel, Predictors, PrefillTimeModel
from kvcake.core.api import (
    ClusterSnapshot,
    DecodeState,
    KVIndex,
    PrefillState,
    Role,
)
from kvcake.core.costmodel import DecodeCoefficients, PrefillCoefficients
from kvcake.core.ids import InstanceId
from kvcake.proxy.client import RemoteInstance
from kvcake.serve.events import POOL
from kvcake.serve.online_fit import MIN_FULL_FIT, OnlineFit, RecentWait, WaitFit, WaitModel
from kvcake.serve.wire import InstanceError

log = logging.getLogger(__name__)


@dataclass
class Pending:
    """Requests the proxy placed on a decode instance that have not joined its batch yet
    (the instance cannot report them: they are still in prefill)."""

    requests: int = 0
    tokens: int = 0
    # Prefill side: the prefill queue. The proxy holds it (one running prefill per instance,
    # the rest wait in the router), so this is its one source of truth.
    prefill_s: float = 0.0  # predicted prefill seconds dispatched, not finished
    prefill_requests: int = 0
    running_pred: float = 0.0  # predicted seconds of the prefill holding the gate now
    running_since: float = 0.0  # time.monotonic() it took the gate (0 = none)

    def queued_seconds(self, now: float) -> float:
        """Predicted seconds until a new prefill could start: the waiting ones plus what is
        left of the running one."""
        done = min(self.running_pred, now - self.running_since) if self.running_since else 0.0
        return max(0.0, self.prefill_s - done)


@dataclass
class LiveCluster:
    instances: dict[InstanceId, RemoteInstance]
    block_tokens: int
    kv_bytes_per_token: int
    link_bandwidth: float
    kv_index: KVIndex = field(default_factory=PrefixIndex)
    pool_from_store: bool = False  # the store master's events own the POOL holder (pool_events)
    seqs: dict[InstanceId, int] = field(default_factory=dict)
    pending: dict[InstanceId, Pending] = field(default_factory=dict)
    # Per prefill instance: its prefill *service* time as the proxy sees it (gate taken ->
    # result: reservation, RPC, fetch, compute, KV wait), fitted online. This is what the
    # prefill queue is made of, so TTFT predictions use it rather than compute time alone.
    service_fit: dict[InstanceId, OnlineFit] = field(default_factory=dict)
    # Per prefill instance: the measured queue wait against the predicted work ahead (the
    # snapshot's queued_seconds is this fit, not the bare sum of predictions).
    wait_fit: dict[InstanceId, WaitFit] = field(default_factory=dict)
    # Per decode instance: recent waits for its KV reservation (inside the prefill gate).
    decode_wait: dict[InstanceId, RecentWait] = field(default_factory=dict)
    polls: int = 0
    # time.monotonic() of each instance's last answered poll (proxy/health.py: `peers`)
    last_answer: dict[InstanceId, float] = field(default_factory=dict)

    def alive(self, role: Role) -> list[RemoteInstance]:
        return [i for i in self.instances.values() if i.alive and i.role in (role, Role.BOTH)]

    def alive_any(self) -> bool:
        return bool(self.alive(Role.PREFILL)) and bool(self.alive(Role.DECODE))

    def mark_dead(self, iid: InstanceId, why: str) -> None:
        inst = self.instances.get(iid)
        if inst is not None and inst.alive:
            log.warning("instance %s is down: %s", iid, why)
            inst.alive = False
            self.kv_index.drop_holder(iid)
            self.seqs.pop(iid, None)

    async def poll_once(self) -> None:
        await asyncio.gather(*(self._poll(i) for i in self.instances.values()))
        self.polls += 1

    async def _poll(self, inst: RemoteInstance) -> None:
        iid = inst.instance_id
        since = self.seqs.get(iid, -1)
        try:
            st = await inst.fetch_state(since)
        except InstanceError as exc:
            self.mark_dead(iid, str(exc))
            self.last_answer.setdefault(iid, 0.0)
            return
        except Exception as exc:  # a malformed answer: that instance is down, the poller goes on
            log.warning("instance %s answered its state badly: %r", iid, exc)
            self.mark_dead(iid, f"bad state answer: {exc!r}")
            self.last_answer.setdefault(iid, 0.0)
            return
        self.last_answer[iid] = time.monotonic()
        if not inst.alive:
            log.warning("instance %s is back", iid)
            inst.alive = True
        if since >= 0 and st.last_seq > since and st.first_seq > since + 1:
            # A gap: events were dropped from the instance's buffer. Re-read everything.
            self.kv_index.drop_holder(iid)
            self.seqs.pop(iid, None)
            return
        if since < 0:
            self.kv_index.drop_holder(iid)
        for ev in st.events:
            if not (self.pool_from_store and ev.instance_id == POOL):
                self.kv_index.apply(ev)
        self.seqs[iid] = max(st.last_seq, since)

    async def run(self, interval: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                await self.poll_once()
            except Exception:  # the poller is what marks instances back: it must not end
                log.exception("polling the instances failed; polling again")
            delay = max(0.0, interval - (time.monotonic() - t0))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    def record_service(
        self, iid: InstanceId, prompt: int, cached: int, seconds: float, seed: PrefillCoefficients
    ) -> None:
        """One measured prefill service time; ``seed``: the coefficients to start from when
        the instance reported none (the conductor's current ones)."""
        fit = self.service_fit.get(iid)
        if fit is None:
            inst = self.instances[iid]
            if _has(inst, "prefill"):  # its warm-up / own fit
                seed = PrefillCoefficients(*map(float, _fitted(inst)["prefill"]))
            fit = OnlineFit(seed, DecodeCoefficients(0.0, 0.0, 0.0), few="offset")
            self.service_fit[iid] = fit
        fit.add_prefill(prompt, cached, seconds)

    def record_wait(self, iid: InstanceId, queued_s: float, waited_s: float) -> None:
        """One request's predicted queue ahead (at enqueue) and the wait it measured."""
        self.wait_fit.setdefault(iid, WaitFit()).add(queued_s, waited_s)

    def record_decode_wait(self, iid: InstanceId, seconds: float) -> None:
        """How long one KV reservation on decode instance ``iid`` waited for room."""
        self.decode_wait.setdefault(iid, RecentWait()).add(seconds)

    def wait_model(self, iid: InstanceId) -> WaitModel:
        fit = self.wait_fit.get(iid)
        return fit.model() if fit is not None else WaitModel()

    def queue_calibrated(self, iid: InstanceId) -> bool:
        """A new request's predicted queue on ``iid`` comes from a fitted WaitFit (or there is
        no queue): its measured/predicted TTFT then says how far the calibrated prediction is
        off (admission's margin), not how far the uncalibrated start was."""
        pend = self.pending.get(iid)
        return (
            pend is None
            or not pend.prefill_requests
            or (self.wait_model(iid).samples >= MIN_FULL_FIT)
        )

    def expected_queue_s(self, iid: InstanceId, now: float) -> float:
        """Seconds a new request would wait before its prefill service starts on ``iid``:
        the fitted wait for the work queued there (0 with nothing queued), plus the smallest
        recent decode-KV wait over the healthy decode instances (a reservation waits inside
        the prefill gate, so it delays this queue too; with one decode instance, exact)."""
        pend = self.pending.get(iid)
        q = self.wait_model(iid).predict(pend.queued_seconds(now)) if pend else 0.0
        if pend is None or not pend.prefill_requests:
            q = 0.0
        waits = [self.decode_wait[d.instance_id].value for d in self.alive(Role.DECODE)
                 if d.instance_id in self.decode_wait and d.instance_id != iid]  # fmt: skip
        return q + (min(waits) if waits else 0.0)

    def wait_gauges(self) -> list[tuple[str, str, float]]:
        """``(stage, coefficient, value)`` for /metrics: the queue-wait fit (mean over the
        prefill instances: ``a`` s, ``b`` x, its mean absolute error ``error_s``, samples) and
        the recent decode-KV wait (mean over decode instances, s)."""
        out: list[tuple[str, str, float]] = []
        models = [self.wait_model(i.instance_id) for i in self.alive(Role.PREFILL)]
        models = [m for m in models if m.samples]
        if models:
            n = len(models)
            out += [("queue_wait", "a", sum(m.a for m in models) / n),
                    ("queue_wait", "b", sum(m.b for m in models) / n),
                    ("queue_wait", "error_s", sum(m.error_s for m in models) / n),
                    ("queue_wait", "samples", float(sum(m.samples for m in models)))]  # fmt: skip
        if self.decode_wait:
            vals = [w.value for w in self.decode_wait.values()]
            out.append(("decode_wait", "recent_s", sum(vals) / len(vals)))
        return out

    def _prefill_fit(self, inst: RemoteInstance) -> dict[str, Any]:
        fit = self.service_fit.get(inst.instance_id)
        if fit is not None:
            f = fit.fitted().as_dict()
            if int(f["prefill_samples"]):  # type: ignore[call-overload]
                return f
        return _fitted(inst) if _has(inst, "prefill") else {}

    def fitted_predictors(self, current: Predictors) -> Predictors | None:
        """``current`` with the prefill / decode coefficients the instances fitted online (mean
        over the live instances of each role that reported some samples); None if none did."""
        pre = [self._prefill_fit(i) for i in self.alive(Role.PREFILL)]
        pre = [f for f in pre if f]
        dec = [_fitted(i) for i in self.alive(Role.DECODE) if _has(i, "decode")]
        if not pre and not dec:
            return None
        p, d = current.prefill, current.decode
        if pre:
            c = [sum(float(f["prefill"][k]) for f in pre) / len(pre) for k in range(3)]
            err = sum(float(f.get("prefill_error", 0.0)) for f in pre) / len(pre)
            p = PrefillTimeModel(PrefillCoefficients(*c), err)
        if dec:
            c = [sum(float(f["decode"][k]) for f in dec) / len(dec) for k in range(3)]
            err = sum(float(f.get("decode_error", 0.0)) for f in dec) / len(dec)
            d = DecodeTBTModel(DecodeCoefficients(*c), err)
        return Predictors(p, current.transfer, d)

    def snapshot(self, now_s: float) -> ClusterSnapshot:
        now = time.monotonic()
        prefill = tuple(
            PrefillState(
                instance_id=i.instance_id,
                # The queue is the proxy's (router gates): current, where reports lag a poll;
                # calibrated on the waits it really caused.
                queued_seconds=self.expected_queue_s(i.instance_id, now),
                queued_requests=self.pending.get(i.instance_id, Pending()).prefill_requests,
                healthy=i.alive and i.load_report().healthy,
            )
            for i in self.alive(Role.PREFILL)
        )
        decode = []
        for i in self.alive(Role.DECODE):
            rep, pend = i.load_report(), self.pending.get(i.instance_id, Pending())
            decode.append(
                DecodeState(
                    instance_id=i.instance_id,
                    running_requests=rep.running_requests,
                    running_context_tokens=rep.running_context_tokens,
                    kv_capacity_tokens=i.info.kv_blocks_total * self.block_tokens,
                    pending_requests=pend.requests,
                    pending_context_tokens=pend.tokens,
                    healthy=i.alive and rep.healthy,
                )
            )
        return ClusterSnapshot(
            now_s=now_s,
            prefill=prefill,
            decode=tuple(decode),
            kv_index=self.kv_index,
            block_tokens=self.block_tokens,
            kv_bytes_per_token=self.kv_bytes_per_token,
            link_bandwidth=self.link_bandwidth,
        )


def _fitted(inst: RemoteInstance) -> dict[str, Any]:
    return inst.state.fitted if inst.state is not None else {}


def _has(inst: RemoteInstance, role: str) -> bool:
    """The instance reported coefficients fitted from at least one sample of ``role``."""
    f = _fitted(inst)
    return bool(f) and int(f.get(f"{role}_samples", 0)) > 0 and len(f.get(role, ())) == 3
