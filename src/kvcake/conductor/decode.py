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


@dataclass(frozen=True, slots=True)
class DecodeChoice:
    index: int
    instance_id: InstanceId
    tbt_s: float
    fits: bool
    healthy: int  # healthy decode instances in the snapshot (all, not just candidates)


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
    try:
        best, tbt, fits, healthy = _scan(states, model, request, only)
    except TypeError:  # None or a string where a count belongs
        raise SchedulingError("decode states must hold integer counts") from None
    if len({d.instance_id for d in states}) != len(states):
        raise SchedulingError("snapshot lists a decode instance twice")
    if best < 0:
        return None
    return DecodeChoice(best, states[best].instance_id, tbt, fits, healthy)


def _scan(
    states: tuple[DecodeState, ...],
    model: DecodeTBTModel,
    request: RequestView,
    only: InstanceId | None,
) -> tuple[int, float, bool, int]:
    """(best index or -1, its TBT, whether it fits, healthy count) — the hot loop."""
    c = model.coefficients
    need = request.prompt_len + request.expected_output
    best, best_fits, best_tbt, healthy = -1, False, math.inf, 0
    for i, d in enumerate(states):
        rr, rc = d.running_requests, d.running_context_tokens
        pr, pc, cap = d.pending_requests, d.pending_context_tokens, d.kv_capacity_tokens
        if rr < 0 or rc < 0 or pr < 0 or pc < 0 or cap <= 0:
            check_decode_state(d)  # raises with the message
        if not d.healthy:
            continue
        healthy += 1
        if only is not None and d.instance_id != only:
            continue
        used = rc + pc
        tbt = c.d0 + c.d1 * (rr + pr + 1) + c.d2 * (used + request.prompt_len)
        fits = used + need <= cap
        # Fitting instances first, then the smallest TBT; ties keep the earlier instance.
        if (fits and not best_fits) or (fits == best_fits and tbt < best_tbt):
            best, best_fits, best_tbt = i, fits, tbt
    return best, best_tbt, best_fits, healthy


def recheck_tbt(state: DecodeState, model: DecodeTBTModel, request: RequestView) -> float:
    """TBT once ``request`` joins ``state``'s *running* batch (the per-stage check after
    prefill: pending requests are still prefilling and do not slow this iteration)."""
    return model.step_time(
        state.running_requests + 1, state.running_context_tokens + request.prompt_len
    )
