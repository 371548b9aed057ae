"""vLLM-like baselines: ``prefill_nodes + decode_nodes`` colocated instances on the same
hardware and cost model as Mooncake, routed by the same conductor (``colocated=True``).

Each instance runs vLLM's scheduling loop at every iteration boundary:

* ``vllm``: prefill first. A waiting prompt whose KV fits is prefilled in its own iteration
  and the running decode batch stalls meanwhile (the cause of vLLM's long TBT tail).
* ``vllm-prefix``: the same, plus automatic prefix caching in HBM: blocks of finished prompts
  stay cached in the *free* KV memory (LRU) and a new prompt skips its cached prefix.
* ``vllm-chunked``: chunked prefill. Every iteration carries all running decodes plus a chunk
  of the head prompt filling the token budget (``vllm_batch_tokens``), so decode never stalls
  for a whole prompt, but every iteration is slower while a prompt is being prefilled.

Memory: ``kv_used`` counts prompt+output tokens reserved by requests being prefilled or
decoded; a prompt starts only if its reservation fits; the prefix cache may only use the rest
(``capacity - kv_used``) and shrinks (evicting LRU blocks) when reservations grow.
"""

from __future__ import annotations

from collections import deque

from kvcake.core.api import ClusterSnapshot, DecodeState, PrefillState, RequestView
from kvcake.core.ids import InstanceId
from kvcake.sim.batch import DecodeBatch
from kvcake.sim.cache import LRUBlockCache
from kvcake.sim.cluster import ClusterBase
from kvcake.sim.config import SimConfig
from kvcake.sim.events import EventQueue, Prio
from kvcake.sim.request import Outcome, SimRequest
from kvcake.sim.sched import Scheduler


class ColocatedInstance(DecodeBatch):
    __slots__ = (
        "_chunk",
        "busy_until",
        "cache",
        "chunk_pos",
        "cl",
        "idx",
        "iid",
        "kv_used",
        "prefilling",
        "waiting",
        "waiting_s",
    )

    def __init__(self, cl: VLLMCluster, idx: int) -> None:
        super().__init__(cl.eq, cl.cm.decode, cl.finish)
        self.cl = cl
        self.idx = idx
        self.iid = InstanceId(f"n{idx}")
        self._chunk = 1
        self.waiting: deque[SimRequest] = deque()
        self.kv_used = 0
        self.prefilling: SimRequest | None = None  # head prompt in (chunked) prefill
        self.chunk_pos = 0  # chunked: tokens of ``prefilling`` already computed
        self.busy_until = 0.0  # whole-prompt prefill in progress until then
        self.waiting_s = 0.0  # predicted prefill seconds of ``waiting`` (uncached)
        blocks = cl.cfg.decode_kv_tokens // cl.cfg.block_tokens
        self.cache = LRUBlockCache(blocks, self.iid, cl.index) if cl.prefix else None

    # --- load -------------------------------------------------------------------------------

    def queued_seconds(self, now: float) -> float:
        pending = self.waiting_s if self.waiting else 0.0
        if self.prefilling is not None:
            r = self.prefilling
            pending += self.cl.cm.prefill_time(r.prompt_len, self.chunk_pos)
        return max(self.busy_until - now, 0.0) + pending

    # --- the scheduling loop ----------------------------------------------------------------

    def submit(self, now: float, req: SimRequest) -> None:
        self.waiting.append(req)
        self.waiting_s += self.cl.cm.prefill_time(req.prompt_len, 0)
        if self.prefilling is not None or self.busy_until > now:
            return  # a prefill is running; its end runs the loop again
        if self.members:
            self.interrupt(now)  # the next boundary will consider the prompt
        else:
            self._next(now)

    def epoch_end(self, now: float, steps: int) -> bool:
        if self.prefilling is not None and self.cl.chunked:
            self._advance_chunks(now, steps)
        self._next(now)
        return False

    def _fits(self, req: SimRequest) -> bool:
        need = req.prompt_len + req.output_len
        return self.kv_used + need <= self.cl.cfg.decode_kv_tokens or self.kv_used == 0

    def _start(self, req: SimRequest, now: float) -> int:
        """Reserve memory, look up the prefix cache; returns cached tokens."""
        self.kv_used += req.prompt_len + req.output_len
        req.prefill_start = now
        cached = 0
        if self.cache is not None:
            bt = self.cl.cfg.block_tokens
            self.cache.capacity_blocks = max(0, (self.cl.cfg.decode_kv_tokens - self.kv_used) // bt)
            hit = self.cache.prefix_len(req.blocks)
            self.cache.touch(req.blocks[:hit])
            self.cache.insert(())  # apply the shrunken capacity
            cached = min(hit * bt, req.prompt_len - 1)
        req.hit_tokens = req.local_hit_tokens = cached
        return cached

    def _next(self, now: float) -> None:
        """At a boundary: continue/start a prefill, else run a decode epoch."""
        cl = self.cl
        if self.prefilling is None and self.waiting and self._fits(self.waiting[0]):
            head = self.waiting.popleft()
            self.waiting_s -= self.cl.cm.prefill_time(head.prompt_len, 0)
            self.prefilling = head
            self.chunk_pos = self._start(head, now)
        req = self.prefilling
        if req is None:
            self.start_epoch(now)
            return
        if cl.chunked and self.members:
            self._chunk_epoch(now, req)
            return
        t = cl.cm.prefill_time(req.prompt_len, self.chunk_pos)
        req.prefill_compute += t
        self.busy_until = now + t
        # members wait: their next gap includes this stall
        self.eq.schedule(now + t, Prio.FINISH, self._whole_prefill_done, req)

    def _whole_prefill_done(self, now: float, req: SimRequest) -> None:
        self.chunk_pos = req.prompt_len
        self._prefill_finished(now, req)
        self._next(now)

    def _chunk_epoch(self, now: float, req: SimRequest) -> None:
        c = self.cl.cm.prefill
        budget = max(self.cl.cfg.vllm_batch_tokens - len(self.members) - len(self.pending), 16)
        left = req.prompt_len - self.chunk_pos
        full = left // budget
        p0 = self.chunk_pos
        if full == 0:
            self.extra = (c.time(req.prompt_len, p0), 0.0)
            steps = 1
        else:
            self.extra = (
                c.c0 + c.c1 * budget + c.c2 * (2 * p0 * budget + budget**2),
                2 * c.c2 * budget**2,
            )
            steps = full
        self._chunk = budget
        self.start_epoch(now, max_steps=steps)
        self.extra = (0.0, 0.0)

    def _advance_chunks(self, now: float, steps: int) -> None:
        req = self.prefilling
        assert req is not None
        before = self.chunk_pos
        left = req.prompt_len - before
        self.chunk_pos = (
            min(req.prompt_len, before + steps * self._chunk)
            if left >= self._chunk
            else (req.prompt_len if steps else before)
        )
        if self.chunk_pos > before:
            req.prefill_compute += self.cl.cm.prefill_time(self.chunk_pos, before)
        if self.chunk_pos >= req.prompt_len:
            self._prefill_finished(now, req)

    def _prefill_finished(self, now: float, req: SimRequest) -> None:
        self.prefilling = None
        self.busy_until = now
        req.first_token = req.last_tok = req.kv_ready = now
        self.cl.prefill_done(now, req)
        if self.cache is not None:
            self.cache.insert(req.blocks)
        if req.remaining == 0:
            req.finish = now
            self.cl.finish(now, req, release=True)
        else:
            self.pending.append(req)


class VLLMCluster(ClusterBase):
    def __init__(self, cfg: SimConfig, eq: EventQueue, scheduler: Scheduler | None = None) -> None:
        super().__init__(cfg, eq, scheduler, colocated=True)
        self.prefix = cfg.system == "vllm-prefix"
        self.chunked = cfg.system == "vllm-chunked"
        self.inst = [ColocatedInstance(self, i) for i in range(cfg.nodes)]
        self._by_id = {n.iid: n for n in self.inst}
        self._views: dict[int, RequestView] = {}

    def snapshot(self, now: float) -> ClusterSnapshot:
        cap = self.cfg.decode_kv_tokens
        pre = tuple(PrefillState(n.iid, n.queued_seconds(now), len(n.waiting)) for n in self.inst)
        dec = tuple(
            DecodeState(
                n.iid,
                n.size,
                n.context_with_pending(now),
                cap,
                len(n.waiting) + (n.prefilling is not None),
                sum(r.prompt_len for r in n.waiting),
            )
            for n in self.inst
        )
        kvb = self.cm.model.kv_bytes_per_token
        bw = self.cfg.link_bytes_per_s
        return ClusterSnapshot(now, pre, dec, self.index, self.cfg.block_tokens, kvb, bw)

    def arrive(self, now: float, req: SimRequest) -> None:
        got = self.decide(now, req)
        if got is None:
            return
        view, decision = got
        self._views[req.rid] = view
        inst = self._by_id[decision.prefill]
        req.prefill_inst = req.decode_inst = inst.idx
        inst.submit(now, req)

    def finish(self, now: float, req: SimRequest, release: bool = True) -> None:
        inst = self.inst[req.decode_inst]
        inst.kv_used -= req.prompt_len + req.output_len
        assert inst.kv_used >= 0, "colocated KV accounting went negative"
        req.outcome = Outcome.DONE
        self.finished.append(req)
        self.scheduler.on_decode_done(self._views.pop(req.rid).request_id, now)

    def prefill_done(self, now: float, req: SimRequest) -> None:
        self.scheduler.on_prefill_done(self._views[req.rid].request_id, now)

    def loads(self, now: float) -> tuple[float, float]:
        n = len(self.inst)
        pl = sum(i.queued_seconds(now) for i in self.inst) / n
        dl = sum(i.step_time(now) for i in self.inst) / n
        return pl / self.cfg.conductor.ttft_slo_s, dl / self.cfg.conductor.tbt_slo_s
