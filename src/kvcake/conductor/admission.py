"""Admission (overload) policies, pluggable by name through :data:`ADMISSION_POLICIES`.

* ``none`` — accept everything a healthy instance can take.
* ``per-stage`` — the prefill stage rejects when the predicted TTFT misses the SLO; the decode
  stage re-checks the TBT SLO after prefill (:meth:`Conductor.recheck_decode`) and may reject,
  wasting that prefill (the paper's baseline).
* ``early-rejection`` — at arrival reject when the TTFT *or* the decode instance's current
  predicted TBT misses its SLO (decode load judged before accepted requests reach decode).
* ``prediction`` — like early rejection, but the decode load is predicted system-wide for the
  moment ``t = now + TTFT`` the request would reach decode: every accepted request is assumed to
  decode for a uniform ``t_d``; those whose prefill ends before ``t`` are added, those whose
  decode ends before ``t`` dropped, and the average TBT per decode instance is compared with the
  SLO (arXiv report §7).

Policies keep their own bookkeeping; the conductor forwards the hooks ``on_accept``,
``on_prefill_done``, ``on_decode_done`` and ``on_abort``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, NamedTuple

import numpy as np

from kvcake.conductor.predictors import DecodeTBTModel
from kvcake.conductor.registry import make_named
from kvcake.core.api import Accept, RequestView
from kvcake.core.errors import ConfigError
from kvcake.core.ids import RequestId

if TYPE_CHECKING:
    from kvcake.conductor.config import ConductorConfig

# Reject reasons (stable strings: the simulator and the proxy count them).
NO_PREFILL = "no-healthy-prefill-instance"
NO_DECODE = "no-healthy-decode-instance"
TTFT_SLO = "ttft-slo"
TBT_SLO = "tbt-slo"
KV_FULL = "decode-kv-full"
PREDICTED_TBT_SLO = "predicted-tbt-slo"
TBT_SLO_AFTER_PREFILL = "tbt-slo-after-prefill"


class AdmissionInput(NamedTuple):
    request: RequestView
    now_s: float
    ttft_s: float  # predicted TTFT on the chosen prefill instance
    tbt_s: float  # predicted TBT on the chosen decode instance
    decode_fits: bool  # the chosen decode instance has KV room for the request
    decode_instances: int  # healthy decode instances
    # Seconds the request already spent since it arrived (``now - request.arrival_s``: the
    # live proxy reads and tokenizes the body first). TTFT counts from arrival, so admission
    # judges ``waited_s + ttft_s``; the simulator places at arrival (0).
    waited_s: float = 0.0

    @property
    def ttft_from_arrival(self) -> float:
        return self.waited_s + self.ttft_s


class AdmissionPolicy:
    """Accept/reject at arrival (the base class accepts everything). ``recheck_at_decode``: whether the decode stage re-checks the
    TBT SLO after prefill."""

    name: ClassVar[str]
    recheck_at_decode: ClassVar[bool] = False

    def __init__(self, ttft_slo_s: float = 30.0, tbt_slo_s: float = 0.3) -> None:
        self.ttft_slo_s = ttft_slo_s
        self.tbt_slo_s = tbt_slo_s
        # Predicted TTFT is multiplied by this before the SLO check (>= 1): the live proxy sets
        # it from how far measured TTFTs have recently exceeded predictions (1 = trust them).
        self.ttft_margin = 1.0
        self.ttft_headroom = 0.0  # the conductor sets ConductorConfig.ttft_headroom

    def ttft_misses(self, ttft_s: float) -> bool:
        return ttft_s * self.ttft_margin > self.ttft_slo_s * (1.0 - self.ttft_headroom)

    @classmethod
    def from_config(cls, config: ConductorConfig, decode: DecodeTBTModel) -> AdmissionPolicy:
        return cls(config.ttft_slo_s, config.tbt_slo_s)

    def admit(self, x: AdmissionInput) -> str | None:
        """``None`` to accept, else the reject reason."""
        return None

    # Lifecycle hooks: no-ops unless a policy keeps bookkeeping.
    def on_accept(self, request: RequestView, decision: Accept, now_s: float) -> None:
        return None

    def on_prefill_done(self, request_id: RequestId, now_s: float) -> None:
        return None

    def on_decode_done(self, request_id: RequestId, now_s: float) -> None:
        return None

    def on_abort(self, request_id: RequestId) -> None:
        return None


class NoAdmission(AdmissionPolicy):
    name = "none"


class PerStageAdmission(AdmissionPolicy):
    name = "per-stage"
    recheck_at_decode = True

    def admit(self, x: AdmissionInput) -> str | None:
        if self.ttft_misses(x.ttft_from_arrival):
            return TTFT_SLO
        return None if x.decode_fits else KV_FULL


class EarlyRejection(AdmissionPolicy):
    name = "early-rejection"

    def admit(self, x: AdmissionInput) -> str | None:
        if self.ttft_misses(x.ttft_from_arrival):
            return TTFT_SLO
        if not x.decode_fits:
            return KV_FULL
        return TBT_SLO if x.tbt_s > self.tbt_slo_s else None


class PredictionAdmission(AdmissionPolicy):
    """Bookkeeping: one slot per accepted, unfinished request holding its predicted prefill
    end, decode duration t_d, decode end and context tokens (numpy arrays, so a check is a few
    vector operations over the in-flight requests)."""

    name = "prediction"

    def __init__(
        self,
        ttft_slo_s: float = 30.0,
        tbt_slo_s: float = 0.3,
        decode: DecodeTBTModel | None = None,
        uniform_decode_s: float = 0.0,
    ) -> None:
        super().__init__(ttft_slo_s, tbt_slo_s)
        if decode is None:
            raise ConfigError("prediction admission needs a DecodeTBTModel")
        self.decode = decode
        self.uniform_decode_s = uniform_decode_s
        self._td_sum = 0.0  # observed decode durations (prefill end -> decode end)
        self._td_n = 0
        self._slot: dict[RequestId, int] = {}
        self._free: list[int] = []
        self._prefill_end = np.zeros(0)
        self._decode_end = np.zeros(0)
        self._duration = np.zeros(0)
        self._ctx = np.zeros(0)
        self._live = np.zeros(0, dtype=bool)

    @classmethod
    def from_config(cls, config: ConductorConfig, decode: DecodeTBTModel) -> AdmissionPolicy:
        return cls(config.ttft_slo_s, config.tbt_slo_s, decode, config.uniform_decode_s)

    def decode_duration(self, request: RequestView, tbt_s: float) -> float:
        """t_d: the configured uniform value; else the mean decode duration observed so far
        (the paper's uniform t_d, learned online: an output-length guess made at arrival
        undercounts the requests still decoding when outputs run longer); before the first
        finished request, ``expected_output * predicted TBT``."""
        if self.uniform_decode_s:
            return self.uniform_decode_s
        if self._td_n:
            return self._td_sum / self._td_n
        return request.expected_output * tbt_s

    def predicted_tbt(self, at_s: float, request: RequestView, decode_instances: int) -> float:
        """Average TBT per decode instance at ``at_s`` with ``request`` added."""
        live = self._live & (self._prefill_end <= at_s) & (self._decode_end > at_s)
        n = int(live.sum()) + 1
        ctx = float(self._ctx[live].sum()) + request.prompt_len
        k = max(decode_instances, 1)
        return self.decode.step_time(n / k, ctx / k)

    @property
    def in_flight(self) -> int:
        return len(self._slot)

    def admit(self, x: AdmissionInput) -> str | None:
        if self.ttft_misses(x.ttft_from_arrival):
            return TTFT_SLO
        if not x.decode_fits:
            return KV_FULL
        tbt = self.predicted_tbt(x.now_s + x.ttft_s, x.request, x.decode_instances)
        return PREDICTED_TBT_SLO if tbt > self.tbt_slo_s else None

    def on_accept(self, request: RequestView, decision: Accept, now_s: float) -> None:
        self.on_abort(request.request_id)  # an id is tracked once
        i = self._free.pop() if self._free else self._grow()
        self._slot[request.request_id] = i
        end = now_s + decision.expected_ttft_s
        dur = self.decode_duration(request, decision.expected_tbt_s)
        self._prefill_end[i], self._duration[i] = end, dur
        self._decode_end[i], self._ctx[i] = end + dur, request.prompt_len
        self._live[i] = True

    def on_prefill_done(self, request_id: RequestId, now_s: float) -> None:
        i = self._slot.get(request_id)
        if i is not None:
            self._prefill_end[i] = now_s
            self._decode_end[i] = now_s + self._duration[i]

    def on_decode_done(self, request_id: RequestId, now_s: float) -> None:
        i = self._slot.get(request_id)
        if i is not None and self._prefill_end[i] <= now_s:
            self._td_sum += now_s - self._prefill_end[i]
            self._td_n += 1
        self.on_abort(request_id)

    def on_abort(self, request_id: RequestId) -> None:
        i = self._slot.pop(request_id, None)
        if i is not None:
            self._live[i] = False
            self._free.append(i)

    def _grow(self) -> int:
        n = self._live.size
        size = max(64, 2 * n)
        for name in ("_prefill_end", "_decode_end", "_duration", "_ctx", "_live"):
            old = getattr(self, name)
            new = np.zeros(size, dtype=old.dtype)
            new[:n] = old
            setattr(self, name, new)
        self._free.extend(range(size - 1, n, -1))
        return n


ADMISSION_POLICIES: dict[str, type[AdmissionPolicy]] = {
    p.name: p for p in (NoAdmission, PerStageAdmission, EarlyRejection, PredictionAdmission)
}


def make_admission_policy(name: str, **params: object) -> AdmissionPolicy:
    """``make_admission_policy("prediction", tbt_slo_s=0.2, decode=model)``; raises
    ``ConfigError`` for an unknown name or parameter."""
    return make_named("admission policy", ADMISSION_POLICIES, name, params)
