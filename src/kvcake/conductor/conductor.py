"""The conductor: one entry point that turns a request and a cluster snapshot into a decision.

``Conductor(config, predictors).schedule(request, snapshot)`` picks a prefill instance with the
configured prefill policy, a decode instance by predicted TBT, and asks the admission policy;
it returns ``core.api.Accept`` or ``core.api.Reject``. The same object serves the simulator and
the live proxy: both call ``schedule`` and then drive the lifecycle hooks (``on_prefill_done``,
``recheck_decode``, ``on_decode_done``, ``on_abort``) as the request progresses. Not
thread-safe: one caller at a time (the proxy's event loop, the simulator's loop).
"""

from __future__ import annotations

import math

import numpy as np

from kvcake.conductor import admission as adm
from kvcake.conductor.admission import AdmissionInput, AdmissionPolicy
from kvcake.conductor.config import ConductorConfig
from kvcake.conductor.decode import check_decode_state, recheck_tbt, select_decode
from kvcake.conductor.predictors import Predictors
from kvcake.conductor.prefill import PREFILL_POLICIES, PrefillPolicy
from kvcake.conductor.view import PrefillView, ViewBuilder
from kvcake.core.api import (
    Accept,
    BlockSource,
    ClusterSnapshot,
    Decision,
    Reject,
    RequestView,
)
from kvcake.core.errors import SchedulingError
from kvcake.core.ids import RequestId


class Conductor:
    def __init__(
        self, config: ConductorConfig | None = None, predictors: Predictors | None = None
    ) -> None:
        self.config = config or ConductorConfig()
        self.predictors = predictors or Predictors.from_preset()
        self.prefill_policy: PrefillPolicy = PREFILL_POLICIES[
            self.config.prefill_policy
        ].from_config(self.config)
        self.admission: AdmissionPolicy = adm.ADMISSION_POLICIES[
            self.config.admission_policy
        ].from_config(self.config, self.predictors.decode)
        self.admission.ttft_headroom = self.config.ttft_headroom
        self._views = ViewBuilder(self.predictors)
        self.last_view: PrefillView | None = None  # the view of the latest decision (inspection)

    def set_predictors(self, predictors: Predictors) -> None:
        """Predict with new coefficients from now on (the live proxy refits them online from
        what the instances measure); bookkeeping of requests in flight is kept."""
        self.predictors = predictors
        self._views = ViewBuilder(predictors)
        if hasattr(self.admission, "decode"):
            self.admission.decode = predictors.decode

    def set_ttft_margin(self, margin: float) -> None:
        """Admission judges ``predicted TTFT x margin`` against the SLO (margin >= 1)."""
        self.admission.ttft_margin = max(1.0, float(margin))

    # -- arrival -------------------------------------------------------------------------------

    def schedule(
        self, request: RequestView, snapshot: ClusterSnapshot, *, commit: bool = True
    ) -> Decision:
        """Decide for ``request`` at ``snapshot.now_s``. With ``commit`` (default) an Accept is
        recorded at once (:meth:`on_accept`); pass ``commit=False`` for a what-if query and call
        :meth:`on_accept` yourself if you act on it. Raises :class:`SchedulingError` for a
        malformed request or snapshot."""
        _check(request, snapshot)
        view = self._views.build(request, snapshot)
        self.last_view = view
        choice = self.prefill_policy.choose(view)
        if choice is None:
            return Reject(adm.NO_PREFILL)
        pid = view.ids[choice.index]
        dec = select_decode(
            snapshot.decode,
            self.predictors.decode,
            request,
            only=pid if self.config.colocated else None,
        )
        if dec is None:
            if self.config.colocated and all(d.instance_id != pid for d in snapshot.decode):
                raise SchedulingError(f"colocated: no decode state for instance {pid}")
            return Reject(adm.NO_DECODE, choice.ttft_s)
        waited = max(0.0, snapshot.now_s - request.arrival_s)
        reason = self.admission.admit(
            AdmissionInput(
                request, snapshot.now_s, choice.ttft_s, dec.tbt_s, dec.fits, dec.healthy, waited
            )
        )
        if reason is not None:  # the TTFT it reports counts from arrival, as the SLO does
            return Reject(reason, waited + choice.ttft_s, dec.tbt_s)
        local = int(view.local[choice.index])
        fetch: tuple[BlockSource, ...] = ()
        if choice.fetch:
            fetch = (BlockSource(local, view.best_len - local, view.best_holder),)
        decision = Accept(pid, dec.instance_id, local, fetch, choice.ttft_s, dec.tbt_s)
        if commit:
            self.on_accept(request, decision, snapshot.now_s)
        return decision

    def estimate_ttfts(self, request: RequestView, snapshot: ClusterSnapshot) -> np.ndarray:
        """Algorithm 1's TTFT estimate for every prefill instance (snapshot order; ``inf`` for
        unhealthy ones), without deciding anything."""
        _check(request, snapshot)
        view = self._views.build(request, snapshot)
        return view.ttft_global(self.config.kvcache_balancing_threshold)[0]

    # -- lifecycle hooks -----------------------------------------------------------------------

    def on_accept(self, request: RequestView, decision: Accept, now_s: float) -> None:
        self.prefill_policy.on_accept(decision)
        self.admission.on_accept(request, decision, now_s)

    def on_prefill_done(self, request_id: RequestId, now_s: float) -> None:
        self.admission.on_prefill_done(request_id, now_s)

    def recheck_decode(
        self, request: RequestView, decision: Accept, snapshot: ClusterSnapshot
    ) -> Decision:
        """The decode stage's check after prefill. Rejects (and forgets the request, like
        :meth:`on_abort`) when ``decision.decode`` has become unhealthy (any policy), or — with
        an admission policy that re-checks (``per-stage``) — when the TBT of its running batch
        with this request added exceeds the SLO. Otherwise returns the decision with the
        refreshed TBT estimate."""
        state = next((d for d in snapshot.decode if d.instance_id == decision.decode), None)
        if state is None:
            raise SchedulingError(f"decode instance {decision.decode} is not in the snapshot")
        check_decode_state(state)
        tbt = recheck_tbt(state, self.predictors.decode, request)
        reason = None
        if not state.healthy:
            reason = adm.NO_DECODE
        elif self.admission.recheck_at_decode and tbt > self.config.tbt_slo_s:
            reason = adm.TBT_SLO_AFTER_PREFILL
        if reason is not None:
            self.on_abort(request.request_id)
            return Reject(reason, decision.expected_ttft_s, tbt)
        return Accept(
            decision.prefill,
            decision.decode,
            decision.local_prefix_blocks,
            decision.fetch,
            decision.expected_ttft_s,
            tbt,
        )

    def on_decode_done(self, request_id: RequestId, now_s: float) -> None:
        self.admission.on_decode_done(request_id, now_s)

    def on_abort(self, request_id: RequestId) -> None:
        self.admission.on_abort(request_id)


def _check(request: RequestView, snap: ClusterSnapshot) -> None:
    try:
        _check_values(request, snap)
    except TypeError:  # None or a string where a number belongs
        raise SchedulingError("request or snapshot holds a non-numeric size") from None


def _check_values(request: RequestView, snap: ClusterSnapshot) -> None:
    if snap.block_tokens <= 0 or snap.kv_bytes_per_token <= 0:
        raise SchedulingError("snapshot.block_tokens and kv_bytes_per_token must be > 0")
    if not (math.isfinite(snap.link_bandwidth) and snap.link_bandwidth > 0):
        raise SchedulingError(f"snapshot.link_bandwidth must be > 0, got {snap.link_bandwidth}")
    if request.prompt_len <= 0 or request.expected_output < 0:
        raise SchedulingError(
            f"request {request.request_id}: prompt_len must be > 0 and expected_output >= 0"
        )
    max_blocks = -(-request.prompt_len // snap.block_tokens)
    if len(request.block_hashes) > max_blocks:
        raise SchedulingError(
            f"request {request.request_id}: {len(request.block_hashes)} block hashes for "
            f"{request.prompt_len} tokens ({max_blocks} blocks of {snap.block_tokens} at most)"
        )
