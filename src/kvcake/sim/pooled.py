"""The Mooncake cluster as the live path runs it (``fetch_source = "pool"``): prefix blocks a
prefill node lacks come from the store pool (:mod:`kvcake.sim.pool`), computed blocks are put
into the pool over the network, and every transfer holds both ends' NICs.

Differences from the paper model in :mod:`kvcake.sim.mooncake` (peer fetches over one NIC FIFO
per prefill node):
- a fetch reads from the store node(s) holding the blocks (their DRAM over their NIC, SSD
  blocks at ``ssd_gbps``), into the prefill node's receive side; blocks on the prefill node's
  own store share are local (no network);
- the KV stream to decode holds the prefill node's transmit and the decode node's receive side;
- after a prefill the blocks the pool lacks are put to their store nodes (prefill TX, store
  RX); they become fetchable (and visible in the index) when the put completes;
- ``prefill_batch_tokens``: queued prompts are batched into one prefill call while their
  uncached tokens fit the budget (the head always runs); the call pays the per-call overhead
  ``c0`` once, every member's KV streams behind the batch's compute and all finish together;
- ``failures``: a failed prefill node leaves the snapshot (``healthy=False``) and the index, and
  its queued requests are rescheduled; a failed decode node's requests fail (rejected after
  prefill) and it takes no new ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvcake.core.api import Accept, ClusterSnapshot, PrefillState
from kvcake.sim.config import SimConfig, parse_failures
from kvcake.sim.events import EventQueue, Prio
from kvcake.sim.livehost import LiveHost, slowed
from kvcake.sim.mooncake import MooncakeCluster, decode_state
from kvcake.sim.nodes import PrefillNode
from kvcake.sim.pool import Nic, StorePool
from kvcake.sim.request import Outcome, SimRequest
from kvcake.sim.sched import Scheduler


class PooledCluster(MooncakeCluster):
    def __init__(
        self,
        cfg: SimConfig,
        eq: EventQueue,
        scheduler: Scheduler | None = None,
        live: LiveHost | None = None,
    ) -> None:
        self.live = live
        cm = slowed(cfg.cost_model(), live.cpu_slowdown) if live is not None else None
        super().__init__(cfg, eq, scheduler, cm)
        # live proxy gates (sim.livehost): when each prefill node's gate opens again
        self._gate = [0.0] * cfg.prefill_nodes
        self._gate_wait: set[int] = set()
        nodes = cfg.prefill_nodes + cfg.decode_nodes
        bt = cfg.block_tokens
        self.pool = StorePool(
            cfg.pool_tokens_per_node * nodes // bt,
            cfg.ssd_tokens_per_node * nodes // bt,
            nodes,
            self.publish or self.index,
        )
        self.nics = [Nic(self.bw) for _ in range(nodes)]  # prefill 0..P-1, then decode
        self.ssd_bw = cfg.ssd_gbps * 1e9 / 8.0
        self.block_bytes = bt * self.kvbpt
        self.dead_p: set[int] = set()
        self.dead_d: set[int] = set()
        for kind, n, at in parse_failures(cfg.failures, cfg.prefill_nodes, cfg.decode_nodes):
            self.eq.schedule(at / cfg.speedup, Prio.FINISH, self._fail, (kind, n))

    # --- conductor's view: failed nodes are unhealthy -----------------------------------------

    def snapshot(self, now: float) -> ClusterSnapshot:
        """As the paper model's, but a prefill node's queue also counts the backlog of its
        transmit side (a request is the prefill instance's until its KV has left: the live
        proxy counts it in flight until then), and failed nodes are unhealthy."""
        bw, nics, dp, dd = self.bw, self.nics, self.dead_p, self.dead_d
        # PrefillNode.queued_seconds / queued_requests inlined (built for every arrival)
        pre = tuple(
            [
                PrefillState(
                    n.iid,
                    max(max(n.busy_until - now, 0.0) + n.queued_pred, nics[n.idx].tx_free - now),
                    len(n.queue) + (n.current is not None) + len(n.batch),
                    bw,
                    n.idx not in dp,
                )
                for n in self.prefill
            ]
        )
        dec = tuple([decode_state(n, now, n.idx not in dd) for n in self.decode])
        return ClusterSnapshot(now, pre, dec, self.index, self.cfg.block_tokens, self.kvbpt, bw)

    # --- fetch source: the pool ---------------------------------------------------------------

    def _fetchable(self, req: SimRequest, local: int, accept: Accept) -> int:
        """Leading blocks beyond ``local`` that the pool holds, up to the end of the range
        the conductor asked to fetch (whoever it named as holder: the live worker reads the
        pool)."""
        end = min(max(s.first_block + s.num_blocks for s in accept.fetch), len(req.blocks))
        return self.pool.run(req.blocks, local, end) if end > local else 0

    def _fetch(self, now: float, p: PrefillNode, blocks: Sequence[int]) -> float:
        dram, ssd = self.pool.read(blocks)
        rx = self.nics[p.idx]
        stores = [s for s in {*dram, *ssd} if s != p.idx]  # own share: local DRAM, no network
        net = sum(dram.get(s, 0) + ssd.get(s, 0) for s in stores) * self.block_bytes
        begin = max([now, rx.rx_free, *(self.nics[s].tx_free for s in stores)])
        dur = net / rx.bw
        for s in {*dram, *ssd}:
            d_s = ssd.get(s, 0) * self.block_bytes / self.ssd_bw
            if s != p.idx:
                d_s += (dram.get(s, 0) + ssd.get(s, 0)) * self.block_bytes / self.nics[s].bw
                self.nics[s].tx_free = begin + d_s
            dur = max(dur, d_s)
        rx.rx_free = begin + dur
        return rx.rx_free

    def _stream(self, p: PrefillNode, req: SimRequest, start: float, end: float) -> float:
        tx = self.nics[p.idx]
        rx = self.nics[self.cfg.prefill_nodes + req.decode_inst]
        stream = req.prompt_len * self.kvbpt / min(tx.bw, rx.bw)
        layer = stream / self.cm.model.layers
        # the links are busy for the bytes only (the stream trickles out with the compute)
        busy = max(start, tx.tx_free, rx.rx_free) + stream
        tx.tx_free = rx.rx_free = busy
        return max(busy, end + layer)

    def _computed(self, now: float, p: PrefillNode, req: SimRequest) -> None:
        p.cache.insert(req.blocks)
        pool = self.pool
        if not pool.enabled:
            return
        # the blocks the pool lacks, counted per store node (``node_of`` inlined: hot path)
        dram, ssd, nodes, me = pool.dram, pool.ssd, pool.nodes, p.idx
        per: dict[int, int] = {}
        for b in req.blocks:
            if b not in dram and b not in ssd:
                s = b % nodes
                if s != me:
                    per[s] = per.get(s, 0) + 1
        tx = self.nics[p.idx]
        begin = max(now, tx.tx_free)
        done = begin + sum(per.values()) * self.block_bytes / tx.bw
        for s, n in per.items():
            rx = self.nics[s]
            rx.rx_free = max(rx.rx_free, begin) + n * self.block_bytes / rx.bw
            done = max(done, rx.rx_free)
        tx.tx_free = done
        self.eq.schedule(done, Prio.FINISH, self._put_done, req.blocks)

    def _put_done(self, _now: float, blocks: tuple[int, ...]) -> None:
        self.pool.put(blocks)

    # --- prefill batching -----------------------------------------------------------------

    def _start_prefill(self, now: float, p: PrefillNode) -> None:
        live = self.live
        if live is None:
            self._start_batch(now, p)
            return
        if now < self._gate[p.idx]:  # the proxy still holds this instance's gate
            if p.idx not in self._gate_wait:
                self._gate_wait.add(p.idx)
                self.eq.schedule(self._gate[p.idx], Prio.FINISH, self._gate_open, p)
            return
        self._start_batch(now, p)
        reqs = [r for r in (p.current, *p.batch) if r is not None]
        # the instance answers once every KV write is complete; the gate opens with the answer
        answer = max(p.busy_until, *(r.kv_ready for r in reqs)) + live.dispatch_s
        for r in reqs:
            r.kv_ready = answer  # the decode stream starts after the answer
        self._gate[p.idx] = p.busy_until = answer

    def _gate_open(self, now: float, p: PrefillNode) -> None:
        self._gate_wait.discard(p.idx)
        if p.current is None and p.queue:
            self._start_prefill(now, p)

    def _start_batch(self, now: float, p: PrefillNode) -> None:
        budget = self.cfg.prefill_batch_tokens
        if not budget or len(p.queue) < 2:
            super()._start_prefill(now, p)
            return
        jobs = [p.queue.popleft()]
        used = jobs[0].req.prompt_len - self.plan(p, jobs[0].req, jobs[0].accept)[2]
        while p.queue:
            nxt = p.queue[0]
            new = nxt.req.prompt_len - self.plan(p, nxt.req, nxt.accept)[2]
            if used + new > budget:
                break
            jobs.append(p.queue.popleft())
            used += new
        for j in jobs:
            p.queued_pred -= j.predicted
        if not p.queue:
            p.queued_pred = 0.0
        start, parts = now, []
        for j in jobs:  # every member's fetch lands before the batch computes
            req = j.req
            local, fetched, cached, _ = self.plan(p, req, j.accept)
            p.cache.touch(req.blocks[:local])
            if fetched:
                start = max(start, self._fetch(now, p, req.blocks[local : local + fetched]))
                p.cache.insert(req.blocks[local : local + fetched])
            c = self.cm.chunked_prefill_time(req.prompt_len, cached, self.cfg.prefill_chunk_tokens)
            parts.append((req, local, cached, c))
        compute = sum(c for *_, c in parts) - (len(parts) - 1) * self.cm.prefill.c0
        load = (
            sum(cached for _, _, cached, _ in parts) * self.kvbpt / self.cm.hardware.h2d_bandwidth
        )
        end = start + max(compute, load)
        bt = self.cfg.block_tokens
        for req, local, cached, c in parts:
            req.kv_ready = self._stream(p, req, start, end)
            req.prefill_start, req.prefill_compute = now, c
            req.hit_tokens, req.local_hit_tokens = cached, min(local * bt, cached)
            req.transfer = (start - now) + (req.kv_ready - end)
        p.current, p.batch = parts[0][0], [r for r, *_ in parts[1:]]
        p.busy_until = end
        p.busy_s += end - now
        self.eq.schedule(end, Prio.FINISH, self._prefill_done, p)

    def _prefill_done(self, now: float, p: PrefillNode) -> None:
        rest, p.batch = p.batch, []
        for req in rest:
            self._finish_prefill(now, p, req)
        super()._prefill_done(now, p)

    def _finish_prefill(self, now: float, p: PrefillNode, req: SimRequest) -> None:
        super()._finish_prefill(now, p, req)
        if self.live is not None:  # proxy -> client: the first chunk comes this much later
            req.first_token = req.kv_ready + self.live.first_token_s

    # --- failures -------------------------------------------------------------------------

    def _fail(self, now: float, what: tuple[str, int]) -> None:
        kind, n = what
        if kind == "p":
            self._fail_prefill(now, n)
        else:
            self._fail_decode(now, n)

    def _fail_prefill(self, now: float, n: int) -> None:
        p = self.prefill[n]
        self.dead_p.add(n)
        self.index.drop_holder(p.iid)
        p.cache = type(p.cache)(0, p.iid, None)  # its DRAM is gone
        queued = list(p.queue)
        p.queue.clear()
        p.queued_pred = 0.0
        for job in queued:  # the proxy re-routes what had not started
            d = self.decode[job.req.decode_inst]
            d.pending_reqs -= 1
            d.pending_ctx -= job.req.prompt_len
            view, _ = self._decisions.pop(job.req.rid)
            self.scheduler.on_abort(view.request_id)
            self.arrive(now, job.req)

    def _fail_decode(self, now: float, n: int) -> None:
        """Requests on the node are lost: those waiting now, those still decoding when they
        would finish, and those whose KV arrives later (their batch keeps its timing, but
        nothing it produces after ``now`` counts)."""
        self.dead_d.add(n)
        d = self.decode[n]
        while d.waiting:
            req = d.waiting.popleft()
            d.pending_reqs -= 1
            d.pending_ctx -= req.prompt_len
            self._lost(now, req)

    def _kv_ready(self, now: float, req: SimRequest) -> None:
        if req.decode_inst in self.dead_d:
            d = self.decode[req.decode_inst]
            d.pending_reqs -= 1
            d.pending_ctx -= req.prompt_len
            self._lost(now, req)
        else:
            super()._kv_ready(now, req)

    def _decode_finished(self, now: float, req: SimRequest) -> None:
        if req.decode_inst in self.dead_d:
            d = self.decode[req.decode_inst]
            d.release(req)
            self._lost(now, req)
            d.admit(now)
        else:
            super()._decode_finished(now, req)

    def _lost(self, now: float, req: SimRequest) -> None:
        view, _ = self._decisions.pop(req.rid)
        self.scheduler.on_abort(view.request_id)
        req.outcome = Outcome.REJECTED_AFTER_PREFILL
        self.finished.append(req)
