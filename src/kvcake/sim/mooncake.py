"""The Mooncake cluster model: disaggregated prefill and decode nodes around the conductor.

Life of a request (paper §2): the conductor (the same code as the live proxy) picks a prefill
and a decode node from a :class:`ClusterSnapshot`; the prefill node, when the request reaches
the head of its FIFO, fetches the prefix blocks the conductor named from their holders over
its NIC (the fetched blocks stay in its DRAM cache: hot blocks get replicated), loads the
cached prefix into HBM layer by layer while computing the suffix (time = max(load, compute);
long suffixes are computed in chunks), and streams each layer's KV to the decode node as it
is produced. Once all KV arrived the request joins the decode node's continuous batch.

Each node's NIC is a FIFO resource shared by its fetches and its KV streams, so low bandwidth
shows up as queueing, not only as longer transfers.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvcake.core.api import (
    Accept,
    ClusterSnapshot,
    Decision,
    DecodeState,
    PrefillState,
    RequestView,
)
from kvcake.core.costmodel import CostModel
from kvcake.core.ids import InstanceId
from kvcake.sim.cluster import ClusterBase
from kvcake.sim.config import SimConfig
from kvcake.sim.events import EventQueue, Prio
from kvcake.sim.nodes import DecodeNode, Job, PrefillNode
from kvcake.sim.pool import LaggedIndex
from kvcake.sim.request import Outcome, SimRequest
from kvcake.sim.sched import Scheduler


class MooncakeCluster(ClusterBase):
    def __init__(
        self,
        cfg: SimConfig,
        eq: EventQueue,
        scheduler: Scheduler | None = None,
        cost_model: CostModel | None = None,
    ) -> None:
        super().__init__(cfg, eq, scheduler, colocated=False, cost_model=cost_model)
        self.kvbpt = self.cm.model.kv_bytes_per_token
        self.bw = cfg.link_bytes_per_s
        cache_blocks = cfg.cache_tokens // cfg.block_tokens
        # what the caches publish to: the conductor's index, possibly with a delivery lag
        self.publish = LaggedIndex(self.index, eq, cfg.index_lag_s) if cfg.index_lag_s else None
        pub = self.publish or self.index
        self.prefill = [
            PrefillNode(i, InstanceId(f"p{i}"), cache_blocks, pub) for i in range(cfg.prefill_nodes)
        ]
        self.decode = [
            DecodeNode(
                i,
                InstanceId(f"d{i}"),
                cfg.decode_kv_tokens,
                eq,
                self.cm.decode,
                self._decode_finished,
            )
            for i in range(cfg.decode_nodes)
        ]
        self._p_by_id = {n.iid: n for n in self.prefill}
        self._d_by_id = {n.iid: n for n in self.decode}
        self._decisions: dict[int, tuple[RequestView, Accept]] = {}

    # --- snapshot -------------------------------------------------------------------------

    def snapshot(self, now: float) -> ClusterSnapshot:
        """The conductor's view at ``now`` (built per decision: it is the hot path)."""
        bw = self.bw
        pre = tuple(
            [
                PrefillState(n.iid, n.queued_seconds(now), n.queued_requests, bw)
                for n in self.prefill
            ]
        )
        dec = tuple([decode_state(n, now) for n in self.decode])
        return ClusterSnapshot(now, pre, dec, self.index, self.cfg.block_tokens, self.kvbpt, bw)

    # --- arrival --------------------------------------------------------------------------

    def arrive(self, now: float, req: SimRequest) -> None:
        got = self.decide(now, req)
        if got is None:
            return
        self._decisions[req.rid] = got
        decision = got[1]
        p, d = self._p_by_id[decision.prefill], self._d_by_id[decision.decode]
        req.prefill_inst, req.decode_inst = p.idx, d.idx
        d.pending_reqs += 1
        d.pending_ctx += req.prompt_len
        pred = self.plan(p, req, decision)[3]
        p.queue.append(Job(req, decision, pred))
        p.queued_pred += pred
        if p.current is None:
            self._start_prefill(now, p)

    # --- prefill --------------------------------------------------------------------------

    def _fetchable(self, req: SimRequest, local: int, accept: Accept) -> int:
        """Leading blocks beyond ``local`` that the named holders still have."""
        have = local
        for src in sorted(accept.fetch, key=lambda s: s.first_block):
            if src.first_block > have:
                break
            holder = self._p_by_id.get(src.holder) if src.holder is not None else None
            end = src.first_block + src.num_blocks
            if holder is None:
                break
            i = have
            while i < end and req.blocks[i] in holder.cache:
                i += 1
            have = i
            if have < end:
                break
        return have - local

    def plan(self, p: PrefillNode, req: SimRequest, accept: Accept) -> tuple[int, int, int, float]:
        """``(local blocks, fetched blocks, cached tokens, predicted seconds)`` if the prefill
        started now on ``p`` (no side effects)."""
        local = p.cache.prefix_len(req.blocks)
        fetched = self._fetchable(req, local, accept) if accept.fetch else 0
        cached = min((local + fetched) * self.cfg.block_tokens, req.prompt_len - 1)
        if self.cfg.predictor_noise:  # the queue estimate comes from the (fitted) predictor
            t = self.scheduler.predictors.prefill.time(req.prompt_len, cached)
        else:
            t = self.cm.chunked_prefill_time(req.prompt_len, cached, self.cfg.prefill_chunk_tokens)
        load = cached * self.kvbpt / self.cm.hardware.h2d_bandwidth
        fetch = fetched * self.cfg.block_tokens * self.kvbpt / self.bw
        return local, fetched, cached, fetch + max(t, load)

    def _start_prefill(self, now: float, p: PrefillNode) -> None:
        job = p.queue.popleft()
        p.queued_pred -= job.predicted
        if not p.queue:
            p.queued_pred = 0.0  # no float drift
        req = job.req
        local, fetched, cached, _ = self.plan(p, req, job.accept)
        bt = self.cfg.block_tokens
        p.cache.touch(req.blocks[:local])
        start_compute = now
        if fetched:
            start_compute = self._fetch(now, p, req.blocks[local : local + fetched])
            p.cache.insert(req.blocks[local : local + fetched])
        fetch_s = start_compute - now
        compute = self.cm.chunked_prefill_time(
            req.prompt_len, cached, self.cfg.prefill_chunk_tokens
        )
        load = cached * self.kvbpt / self.cm.hardware.h2d_bandwidth
        end = start_compute + max(compute, load)
        req.kv_ready = self._stream(p, req, start_compute, end)
        req.prefill_start = now
        req.prefill_compute = compute
        req.hit_tokens = cached
        req.local_hit_tokens = min(local * bt, cached)
        req.transfer = fetch_s + (req.kv_ready - end)
        p.current = req
        p.busy_until = end
        p.busy_s += end - now
        self.eq.schedule(end, Prio.FINISH, self._prefill_done, p)

    def _fetch(self, now: float, p: PrefillNode, blocks: Sequence[int]) -> float:
        """Pull ``blocks`` into ``p`` (peer model: over ``p``'s one NIC FIFO); returns when
        they have arrived."""
        begin = max(now, p.nic_free)
        p.nic_free = begin + len(blocks) * self.cfg.block_tokens * self.kvbpt / self.bw
        return p.nic_free

    def _stream(self, p: PrefillNode, req: SimRequest, start: float, end: float) -> float:
        """Layer-wise streaming of the prompt's KV to the decode node behind the compute
        (``start``..``end``); returns when the KV is complete there."""
        stream = req.prompt_len * self.kvbpt / self.bw
        layer = stream / self.cm.model.layers
        p.nic_free = max(max(start, p.nic_free) + stream, end + layer)
        return p.nic_free

    def _computed(self, now: float, p: PrefillNode, req: SimRequest) -> None:
        """The prompt's blocks exist now (peer model: they join ``p``'s cache = the pool)."""
        p.cache.insert(req.blocks)

    def _prefill_done(self, now: float, p: PrefillNode) -> None:
        req = p.current
        assert req is not None
        p.current = None
        self._finish_prefill(now, p, req)
        if p.queue:
            self._start_prefill(now, p)

    def _finish_prefill(self, now: float, p: PrefillNode, req: SimRequest) -> None:
        self._computed(now, p, req)
        # The decode node returns the first token (computed by the prefill) once the KV has
        # arrived, so TTFT includes the exposed part of the layer-wise KV transfer.
        req.first_token = req.last_tok = req.kv_ready
        d = self.decode[req.decode_inst]
        view, accept = self._decisions[req.rid]
        self.scheduler.on_prefill_done(view.request_id, now)
        recheck: Decision = accept
        if self.scheduler.admission.recheck_at_decode:
            recheck = self.scheduler.recheck_decode(view, accept, self.snapshot(now))
        if not isinstance(recheck, Accept):
            del self._decisions[req.rid]
            req.outcome = Outcome.REJECTED_AFTER_PREFILL
            d.pending_reqs -= 1
            d.pending_ctx -= req.prompt_len
            self.finished.append(req)
        elif req.remaining == 0:
            d.pending_reqs -= 1
            d.pending_ctx -= req.prompt_len
            req.finish = req.kv_ready
            self._done(now, req)
        else:
            self.eq.schedule(req.kv_ready, Prio.READY, self._kv_ready, req)

    # --- decode ---------------------------------------------------------------------------

    def _kv_ready(self, now: float, req: SimRequest) -> None:
        self.decode[req.decode_inst].offer(now, req)

    def _decode_finished(self, now: float, req: SimRequest) -> None:
        d = self.decode[req.decode_inst]
        d.release(req)
        self._done(now, req)
        d.admit(now)

    def _done(self, now: float, req: SimRequest) -> None:
        view, _ = self._decisions.pop(req.rid)
        self.scheduler.on_decode_done(view.request_id, now)
        req.outcome = Outcome.DONE
        self.finished.append(req)

    # --- monitoring -----------------------------------------------------------------------

    def loads(self, now: float) -> tuple[float, float]:
        """Mean prefill load (queue time / TTFT SLO) and decode load (TBT / TBT SLO)."""
        pl = sum(n.queued_seconds(now) for n in self.prefill) / len(self.prefill)
        dl = sum(n.batch.step_time(now) for n in self.decode) / len(self.decode)
        return pl / self.cfg.conductor.ttft_slo_s, dl / self.cfg.conductor.tbt_slo_s

    def replica_counts(self, blocks: Sequence[int]) -> list[int]:
        return [sum(b in n.cache for n in self.prefill) for b in blocks]


def decode_state(n: DecodeNode, now: float, *more: bool) -> DecodeState:
    """What the conductor sees of decode node ``n`` at ``now`` (``more``: the trailing fields a
    caller sets, e.g. whether the node is up)."""
    return DecodeState(
        n.iid,
        n.batch.size,
        n.batch.context_with_pending(now),
        n.capacity,
        n.pending_reqs,
        n.pending_ctx,
        *more,
    )
