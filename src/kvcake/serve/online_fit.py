"""Cost-model coefficients fitted online from what an instance really spends.

Each instance records ``(prompt_len, prefix_len, seconds)`` per prefill and ``(batch, context,
seconds)`` per decode iteration in bounded windows and refits ``core.costmodel``'s polynomials
from them; the proxy's conductor predicts with the fitted values (``InstanceState.fitted``).

Seeding and robustness: before any sample the seed (the calibration file of ``kvcake
calibrate`` or the backend's preset, times ``time_scale``) is used as is. With a few samples, or
samples that span too little of the input range to pin three coefficients, the seed is scaled by
the median measured/predicted ratio (one robust number). A least-squares fit of the relative
error (``core.costmodel.fit_least_squares``, the fitter ``kvcake calibrate`` uses too) replaces
that only when it explains the window better and predicts positive times over the sampled range.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from kvcake.core.costmodel import (
    DecodeCoefficients,
    PrefillCoefficients,
    decode_features,
    fit_least_squares,
    prefill_features,
    relative_error,
)

MIN_FULL_FIT = 4  # samples (of >= 3 distinct sizes) before a full least-squares fit is tried


@dataclass(frozen=True)
class Fitted:
    prefill: tuple[float, float, float]
    decode: tuple[float, float, float]
    prefill_samples: int
    decode_samples: int
    prefill_error: float  # mean |pred - measured| / measured over the window
    decode_error: float

    def as_dict(self) -> dict[str, object]:
        return {
            "prefill": list(self.prefill), "decode": list(self.decode),
            "prefill_samples": self.prefill_samples, "decode_samples": self.decode_samples,
            "prefill_error": self.prefill_error, "decode_error": self.decode_error,
        }  # fmt: skip


def _choose(
    seed: tuple[float, float, float],
    feats: np.ndarray,
    t: np.ndarray,
    full: tuple[float, ...],
    few: str,
) -> tuple[tuple[float, float, float], float]:
    """The seed adjusted by one robust number — ``few="scale"``: times the median measured /
    predicted ratio (the seed's shape is right, its speed is not: a preset on another machine);
    ``"offset"``: plus the median difference (the seed is right, a constant overhead is missing:
    compute measured by the instance vs the service time the proxy sees). With a full fit
    available, the best of the three on the window (predicting positive times) wins."""
    s = np.asarray(seed)
    base = feats @ s
    if not t.size:
        return seed, 0.0
    ratio = float(np.median(t / np.maximum(base, 1e-12)))
    scaled = tuple(float(c * ratio) for c in s)
    shift = float(np.median(t - base))
    offset = (float(s[0] + shift), float(s[1]), float(s[2]))
    first = scaled if few == "scale" else offset
    best, err = first, relative_error(feats, first, t)
    if full:
        for cand in (scaled, offset, full):
            pred = feats @ np.asarray(cand)
            e = relative_error(feats, cand, t)
            if e < err and bool(np.all(pred > 0)):
                best, err = (float(cand[0]), float(cand[1]), float(cand[2])), e
    return best, err  # type: ignore[return-value]


class OnlineFit:
    def __init__(
        self, prefill_seed: PrefillCoefficients, decode_seed: DecodeCoefficients,
        window: int = 256, few: str = "scale",
    ):  # fmt: skip
        self.few = few
        self._pseed = (prefill_seed.c0, prefill_seed.c1, prefill_seed.c2)
        self._dseed = (decode_seed.d0, decode_seed.d1, decode_seed.d2)
        self._prefill: deque[tuple[int, int, float]] = deque(maxlen=window)
        self._decode: deque[tuple[int, int, float]] = deque(maxlen=window)
        self._mu = threading.Lock()
        self._cache: Fitted | None = None

    def add_prefill(self, prompt_len: int, prefix_len: int, seconds: float) -> None:
        if prompt_len > prefix_len and seconds > 0:
            with self._mu:
                self._prefill.append((prompt_len, prefix_len, seconds))
                self._cache = None

    def add_decode(self, batch: int, context: int, seconds: float) -> None:
        if batch > 0 and seconds > 0:
            with self._mu:
                self._decode.append((batch, context, seconds))
                self._cache = None

    def fitted(self) -> Fitted:
        with self._mu:
            if self._cache is None:
                self._cache = self._fit(list(self._prefill), list(self._decode))
            return self._cache

    def _fit(self, pre: list[tuple[int, int, float]], dec: list[tuple[int, int, float]]) -> Fitted:
        pc, pe = self._pseed, 0.0
        if pre:
            feats, t = prefill_features(pre)
            full: tuple[float, ...] = ()
            if len(pre) >= MIN_FULL_FIT and len({L - P for L, P, _ in pre}) >= 3:
                full = fit_least_squares(feats, t, relative=True)
            pc, pe = _choose(self._pseed, feats, t, full, self.few)
        dc, de = self._dseed, 0.0
        if dec:
            feats, t = decode_features(dec)
            full = ()
            if len(dec) >= MIN_FULL_FIT and len({b for b, _, _ in dec}) >= 3:
                full = fit_least_squares(feats, t, relative=True)
            dc, de = _choose(self._dseed, feats, t, full, self.few)
        return Fitted(pc, dc, len(pre), len(dec), pe, de)


@dataclass(frozen=True)
class WaitModel:
    """Measured wait as a function of the predicted work ahead: ``w = a + b * q`` (seconds)."""

    a: float = 0.0
    b: float = 1.0
    samples: int = 0
    error_s: float = 0.0  # mean |predicted - measured| over the window, seconds

    def predict(self, queued_s: float) -> float:
        return max(0.0, self.a + self.b * queued_s)


class WaitFit:
    """The queue a request waits in, calibrated on what the waits really were.

    A request's predicted queue ``q`` (the predicted service seconds of the prefills ahead of it
    on its instance, at enqueue) is paired with the wait it measured (enqueue -> its turn). The
    sum of predictions misses what contention does to a queue (shared CPU, decode-KV waits
    inside the gate, event-loop delays), so the snapshot reports ``a + b*q`` fitted on a bounded
    window: the identity before any sample; with few samples (or all at one queue length) the
    median measured/predicted ratio; with enough, non-negative least squares of ``(a, b)`` —
    each only if it lowers the window's mean absolute error. Errors are absolute (seconds): a
    wait is often ~0, where relative errors mean nothing, and a TTFT SLO is in seconds."""

    def __init__(self, window: int = 128) -> None:
        self._s: deque[tuple[float, float]] = deque(maxlen=window)
        self._mu = threading.Lock()
        self._cache: WaitModel | None = None

    def add(self, queued_s: float, waited_s: float) -> None:
        if queued_s >= 0 and waited_s >= 0 and np.isfinite(queued_s + waited_s):
            with self._mu:
                self._s.append((queued_s, waited_s))
                self._cache = None

    def model(self) -> WaitModel:
        with self._mu:
            if self._cache is None:
                self._cache = _fit_wait(list(self._s))
            return self._cache


def _fit_wait(s: list[tuple[float, float]]) -> WaitModel:
    if not s:
        return WaitModel()
    q = np.array([x for x, _ in s])
    w = np.array([y for _, y in s])

    def err(a: float, b: float) -> float:
        return float(np.mean(np.abs(np.maximum(0.0, a + b * q) - w)))

    cands = [(0.0, 1.0)]
    busy = q > 1e-6
    if busy.any():
        cands.append((0.0, float(np.median(w[busy] / q[busy]))))
    if len(s) >= MIN_FULL_FIT and len(np.unique(np.round(q, 3))) >= 2:
        coef, *_ = np.linalg.lstsq(np.c_[np.ones_like(q), q], w, rcond=None)
        a, b = float(coef[0]), float(coef[1])
        if a < 0:  # non-negative: refit the slope alone
            a, b = 0.0, float(np.dot(q, w) / max(np.dot(q, q), 1e-12))
        elif b < 0:  # the queue does not explain the waits: a constant
            a, b = float(np.mean(w)), 0.0
        cands.append((a, b))
    a, b = min(cands, key=lambda c: err(*c))
    return WaitModel(a, b, len(s), err(a, b))


class RecentWait:
    """An exponentially weighted mean of recent waits (e.g. for decode KV): follows a burst
    within a few samples, and fades with a ``half_life_s`` once no new waits are measured (a
    burst long over says nothing about the next request)."""

    def __init__(self, alpha: float = 0.3, half_life_s: float = 5.0) -> None:
        self.alpha, self.half_life_s = alpha, half_life_s
        self._value, self._at = 0.0, 0.0
        self.samples = 0

    def value_at(self, now: float) -> float:
        age = max(0.0, now - self._at)
        return self._value * 0.5 ** (age / self.half_life_s)

    @property
    def value(self) -> float:
        return self.value_at(time.monotonic())

    def add(self, seconds: float, now: float | None = None) -> None:
        if seconds >= 0 and np.isfinite(seconds):
            t = time.monotonic() if now is None else now
            cur = self.value_at(t)
            self._value, self._at = cur + self.alpha * (seconds - cur), t
            self.samples += 1
