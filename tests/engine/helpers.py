from __future__ import annotations

from typing import Any

from kvcake.core.api import SamplingParams
from kvcake.core.ids import RequestId
from kvcake.engine.scheduler import Request, Scheduler

GREEDY6 = SamplingParams(max_tokens=6, ignore_eos=True)


def run(
    be: Any,
    prompts: list[list[int]],
    sp: SamplingParams = GREEDY6,
    **sched: Any,
) -> list[Request]:
    """Run ``prompts`` as one continuous batch on ``be``; requests in input order."""
    s = Scheduler(be, **sched)
    reqs = [Request(RequestId(f"t{i}"), list(p), sp) for i, p in enumerate(prompts)]
    for r in reqs:
        s.add(r)
    while s.has_work:
        s.step()
    return reqs
