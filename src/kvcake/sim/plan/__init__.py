"""``kvcake plan``: does KV pooling pay off for my workload? Sizes a cluster for a trace with the
simulator (no tokenizer, no sockets: request logs are converted outside, see
:mod:`kvcake.core.requestlog`)."""

from kvcake.sim.plan.planner import Plan, Planner, cheapest, check_trace
from kvcake.sim.plan.search import VARIANTS, PlanConfig, Point, default_slos

__all__ = [
    "VARIANTS",
    "Plan",
    "PlanConfig",
    "Planner",
    "Point",
    "cheapest",
    "check_trace",
    "default_slos",
]
