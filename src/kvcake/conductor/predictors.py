"""Predictors the policies rank instances with, all built on :mod:`kvcake.core.costmodel`.

* :class:`PrefillTimeModel` — prefill seconds as the cost model's polynomial in prompt length
  ``L`` and cached prefix ``P``: ``c0 + c1*(L-P) + c2*(L^2-P^2)``; fitted from measured samples
  or taken from a :class:`CostModel` / calibration file. It also sums a queue of prefills
  (what a snapshot builder puts into ``PrefillState.queued_seconds``).
* :class:`TransferTimeModel` — seconds to pull KV of missing blocks over a link.
* :class:`DecodeTBTModel` — one decode iteration (= time between tokens) from batch size and the
  total context of the batch, counting requests that are still in prefill (pending).

All are immutable; vectorised forms take numpy arrays so one decision costs a few array ops.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvcake.core.api import DecodeState
from kvcake.core.costmodel import (
    CostModel,
    DecodeCoefficients,
    PrefillCoefficients,
    fit_decode,
    fit_prefill,
    load_calibration,
    preset,
)


@dataclass(frozen=True)
class PrefillTimeModel:
    coefficients: PrefillCoefficients
    fit_error: float = 0.0  # mean relative error of the fit (0 when not fitted)

    @classmethod
    def fit(cls, samples: Iterable[tuple[int, int, float]]) -> PrefillTimeModel:
        """Least squares over ``(prompt_len, prefix_len, seconds)`` samples."""
        coef, err = fit_prefill(samples)
        return cls(coef, err)

    @classmethod
    def from_cost_model(cls, cm: CostModel) -> PrefillTimeModel:
        return cls(cm.prefill, float(cm.fit_error.get("prefill", 0.0)))

    @classmethod
    def from_calibration(cls, path: str | Path) -> PrefillTimeModel:
        """From a ``kvcake calibrate`` file (``ConfigError`` when missing or malformed)."""
        return cls.from_cost_model(load_calibration(path))

    def time(self, prompt_len: int, prefix_len: int = 0) -> float:
        """Seconds to prefill ``prompt_len`` tokens of which ``prefix_len`` are cached."""
        return self.coefficients.time(prompt_len, prefix_len)

    def times(
        self, prompt_len: int, prefix_len: np.ndarray, *, any_full: bool = True
    ) -> np.ndarray:
        """Vectorised :meth:`time` for one prompt and many prefix lengths (each in
        ``[0, prompt_len]``); a fully cached prompt costs 0, as in the cost model. Pass
        ``any_full=False`` when no prefix can equal ``prompt_len`` (saves a pass)."""
        c, L = self.coefficients, float(prompt_len)
        # c0 + c1*(L-P) + c2*(L^2-P^2), rearranged to four array operations.
        t = (c.c0 + c.c1 * L + c.c2 * L * L) - prefix_len * (c.c1 + c.c2 * prefix_len)
        return np.where(prefix_len < prompt_len, t, 0.0) if any_full else t

    def queue_seconds(self, queued: Iterable[tuple[int, int]]) -> float:
        """Predicted time to drain a queue of ``(prompt_len, prefix_len)`` prefills: the value
        a snapshot builder reports as ``PrefillState.queued_seconds``."""
        return float(sum(self.time(L, P) for L, P in queued))


@dataclass(frozen=True)
class TransferTimeModel:
    """``latency_s + bytes / bandwidth`` (0 when nothing moves)."""

    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.latency_s >= 0:
            raise ValueError(f"latency_s must be >= 0, got {self.latency_s}")

    def time(self, nbytes: float, bandwidth: float) -> float:
        if bandwidth <= 0:
            raise ValueError("bandwidth must be positive")
        return 0.0 if nbytes <= 0 else self.latency_s + nbytes / bandwidth

    def times(self, nbytes: np.ndarray, bandwidth: np.ndarray) -> np.ndarray:
        return np.where(nbytes > 0, self.latency_s + nbytes / bandwidth, 0.0)

    def token_times(self, tokens: np.ndarray, sec_per_token: np.ndarray | float) -> np.ndarray:
        """Vectorised form with precomputed ``kv_bytes_per_token / bandwidth`` per link."""
        t = tokens * sec_per_token
        if self.latency_s == 0.0:
            return t
        return np.where(tokens > 0, t + self.latency_s, 0.0)


@dataclass(frozen=True)
class DecodeTBTModel:
    coefficients: DecodeCoefficients
    fit_error: float = 0.0

    @classmethod
    def fit(cls, samples: Iterable[tuple[int, int, float]]) -> DecodeTBTModel:
        """Least squares over ``(batch, total_context, seconds)`` samples."""
        coef, err = fit_decode(samples)
        return cls(coef, err)

    @classmethod
    def from_cost_model(cls, cm: CostModel) -> DecodeTBTModel:
        return cls(cm.decode, float(cm.fit_error.get("decode", 0.0)))

    @classmethod
    def from_calibration(cls, path: str | Path) -> DecodeTBTModel:
        return cls.from_cost_model(load_calibration(path))

    def step_time(self, batch: float, total_context: float) -> float:
        """One iteration over ``batch`` sequences with ``total_context`` KV tokens; fractional
        batches are allowed (system-level averages)."""
        if batch <= 0:
            return 0.0
        c = self.coefficients
        return c.d0 + c.d1 * batch + c.d2 * total_context

    def predict(self, state: DecodeState, add_requests: int = 1, add_tokens: int = 0) -> float:
        """TBT on ``state`` once its pending requests and ``add_requests`` more (holding
        ``add_tokens`` context tokens) have joined the batch."""
        return self.step_time(
            state.running_requests + state.pending_requests + add_requests,
            state.running_context_tokens + state.pending_context_tokens + add_tokens,
        )


@dataclass(frozen=True)
class Predictors:
    prefill: PrefillTimeModel
    transfer: TransferTimeModel
    decode: DecodeTBTModel

    @classmethod
    def from_cost_model(cls, cm: CostModel, transfer_latency_s: float = 0.0) -> Predictors:
        return cls(
            PrefillTimeModel.from_cost_model(cm),
            TransferTimeModel(transfer_latency_s),
            DecodeTBTModel.from_cost_model(cm),
        )

    @classmethod
    def from_calibration(cls, path: str | Path, transfer_latency_s: float = 0.0) -> Predictors:
        """From a ``kvcake calibrate`` file (raises ``ConfigError`` when missing/malformed)."""
        return cls.from_cost_model(load_calibration(path), transfer_latency_s)

    @classmethod
    def from_preset(cls, name: str | None = None) -> Predictors:
        """From a ``core.costmodel`` preset (default: LLaMA3-70B on 8xA800)."""
        return cls.from_cost_model(preset() if name is None else preset(name))
