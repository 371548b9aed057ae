"""Decode-instance selection by predicted TBT.

For each healthy decode instance the TBT after the request joins is
``DecodeTBTModel.predict(state, add_requests=1, add_tokens=prompt_len)`` — running *and* pending
requests count, since pending ones (accepted, still in prefill) join soon. An instance *fits*
the request when its KV in use plus the request's ``prompt_len + expected_output`` tokens stays
within ``kv_capacity_tokens``. The choice is the fitting instance with the smallest TBT, or,
when none fits, the smallest TBT overall marked ``fits=False`` (admission decides). Ties go to
the earliest instance in snapshot order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvcake.conductor.predictors import DecodeTBTModel
from kvcake.core.api import DecodeState, RequestView
from kvcake.core.errors import SchedulingError
from kvcake.core.ids import InstanceId


@dataclass(frozen=True)
class DecodeChoice:
    index: int
    instance_id: InstanceId
    tbt_s: float
    fits: bool


def check_decode_state(d: DecodeState) -> None:
    """Raise :class:`SchedulingError` for counts that cannot describe a real instance."""
    if (
        min(
            d.running_requests,
            d.running_context_tokens,
            d.pending_requests,
            d.pending_context_tokens,
        )
        < 0
        or d.kv_capacity_tokens <= 0
    ):
        raise SchedulingError(
            f"decode instance {d.instance_id}: counts must be >= 0 and kv_capacity_tokens > 0"
        )


def select_decode(
    states: tuple[DecodeState, ...],
    model: DecodeTBTModel,
    request: RequestView,
    only: InstanceId | None = None,
) -> DecodeChoice | None:
    """Best decode instance for ``request`` (``only``: restrict to that id, e.g. colocated), or
    ``None`` when no candidate is healthy."""
    c = model.coefficients
    need = request.prompt_len + request.expected_output
    best: DecodeChoice | None = None
    best_key = (True, math.inf)
    seen: set[InstanceId] = set()
    for i, d in enumerate(states):
        check_decode_state(d)
        if d.instance_id in seen:
            raise SchedulingError(f"snapshot lists decode instance {d.instance_id} twice")
        seen.add(d.instance_id)
        if not d.healthy or (only is not None and d.instance_id != only):
            continue
        used = d.running_context_tokens + d.pending_context_tokens
        batch = d.running_requests + d.pending_requests + 1
        tbt = c.d0 + c.d1 * batch + c.d2 * (used + request.prompt_len)
        fits = used + need <= d.kv_capacity_tokens
        key = (not fits, tbt)
        if key < best_key:
            best, best_key = DecodeChoice(i, d.instance_id, tbt, fits), key
    return best


def recheck_tbt(state: DecodeState, model: DecodeTBTModel, request: RequestView) -> float:
    """TBT once ``request`` joins ``state``'s *running* batch (the per-stage check after
    prefill: pending requests are still prefilling and do not slow this iteration)."""
    return model.step_time(
        state.running_requests + 1, state.running_context_tokens + request.prompt_len
    )
