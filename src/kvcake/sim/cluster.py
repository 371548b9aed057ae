"""What the Mooncake and vLLM-like cluster models share: settings, cost model, the conductor
and its KV index, finished requests, and the first step of every arrival (ask the conductor,
count a rejection)."""

from __future__ import annotations

from typing import cast

from kvcake.core.api import Accept, ClusterSnapshot, RequestView
from kvcake.core.costmodel import CostModel
from kvcake.core.ids import BlockHash, RequestId
from kvcake.sim.config import SimConfig
from kvcake.sim.events import EventQueue
from kvcake.sim.request import Outcome, SimRequest
from kvcake.sim.sched import Scheduler, build_scheduler, make_index


class ClusterBase:
    def __init__(
        self,
        cfg: SimConfig,
        eq: EventQueue,
        scheduler: Scheduler | None,
        *,
        colocated: bool,
        cost_model: CostModel | None = None,
    ) -> None:
        self.cfg = cfg
        self.eq = eq
        # the instances' times (a live host may slow them: sim.livehost); the conductor
        # predicts with the configured model either way
        self.cm: CostModel = cost_model or cfg.cost_model()
        self.index = make_index()
        self.scheduler = scheduler or build_scheduler(cfg, colocated=colocated)
        self.finished: list[SimRequest] = []

    def snapshot(self, now: float) -> ClusterSnapshot:
        raise NotImplementedError

    def decide(self, now: float, req: SimRequest) -> tuple[RequestView, Accept] | None:
        """The conductor's decision for ``req`` arriving at ``now``; ``None`` (and the request
        recorded as rejected) unless it was accepted."""
        view = RequestView(
            RequestId(str(req.rid)),
            now,
            req.prompt_len,
            cast(tuple[BlockHash, ...], req.blocks),  # NewType: same ints
            self.cfg.conductor.expected_output_tokens,
        )
        decision = self.scheduler.schedule(view, self.snapshot(now))
        if not isinstance(decision, Accept):
            req.outcome = Outcome.REJECTED
            self.finished.append(req)
            return None
        return view, decision
