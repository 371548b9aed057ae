"""The one cost model (design.md "Shared decisions").

Prefill, decode and transfer times are all linear in a few features, so a model is a handful of
coefficients that come either from hardware specs (paper Eq. 1: ``flops(n) = l*(a*n^2*d + b*n*d^2)``)
or from measurements (``kvcake calibrate`` -> :func:`save_calibration`):

* prefill of a prompt of ``L`` tokens whose first ``P`` are cached:
  ``t = c0 + c1*(L-P) + c2*(L^2-P^2)``  (linear MLP/projection work + quadratic attention)
* one decode iteration over ``batch`` sequences holding ``ctx`` tokens of KV in total:
  ``t = d0 + d1*batch + d2*ctx``  (weights read once + per-sequence compute + KV read)
* moving ``n`` bytes over a link: ``t = latency + n / bandwidth``

The emulated backend, the conductor's predictors and the simulator all use this module.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kvcake.core.errors import ConfigError

EQ1_A = 4.0  # attention coefficient of paper Eq. 1
EQ1_B = 22.0  # projection/MLP coefficient of paper Eq. 1


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    params: float  # parameter count
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        if min(self.layers, self.hidden, self.heads, self.kv_heads, self.dtype_bytes) <= 0:
            raise ConfigError(f"model {self.name}: all sizes must be positive")
        if self.heads % self.kv_heads:
            raise ConfigError(f"model {self.name}: heads must be a multiple of kv_heads")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def gqa(self) -> int:
        return self.heads // self.kv_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer: ``2 * l * (d / gqa) * s``."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    def prefill_flops(self, n: int) -> float:
        """Paper Eq. 1."""
        return self.layers * (EQ1_A * n * n * self.hidden + EQ1_B * n * self.hidden**2)


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    flops: float  # peak FLOP/s of the whole instance
    mfu: float  # achieved fraction of peak in prefill
    mem_bandwidth: float  # bytes/s of device memory, whole instance
    h2d_bandwidth: float  # bytes/s host <-> device
    nic_bandwidth: float  # bytes/s per node
    step_overhead: float = 0.0  # seconds per decode iteration / prefill call (launch, sampling)

    @property
    def effective_flops(self) -> float:
        return self.flops * self.mfu


@dataclass(frozen=True)
class PrefillCoefficients:
    c0: float
    c1: float
    c2: float

    def time(self, prompt_len: int, prefix_len: int = 0) -> float:
        if prefix_len < 0 or prefix_len > prompt_len:
            raise ValueError(f"prefix_len {prefix_len} outside [0, {prompt_len}]")
        new = prompt_len - prefix_len
        if new == 0:
            return 0.0
        return self.c0 + self.c1 * new + self.c2 * (prompt_len**2 - prefix_len**2)


@dataclass(frozen=True)
class DecodeCoefficients:
    d0: float
    d1: float
    d2: float

    def time(self, batch: int, total_context: int) -> float:
        if batch <= 0:
            return 0.0
        return self.d0 + self.d1 * batch + self.d2 * total_context


@dataclass(frozen=True)
class CostModel:
    """Times in seconds for one instance of ``hardware`` running ``model``."""

    model: ModelSpec
    hardware: HardwareSpec
    prefill: PrefillCoefficients
    decode: DecodeCoefficients
    source: str = "analytic"
    fit_error: dict[str, float] = field(default_factory=dict)

    @classmethod
    def analytic(cls, model: ModelSpec, hw: HardwareSpec) -> CostModel:
        g = hw.effective_flops
        pre = PrefillCoefficients(
            c0=hw.step_overhead,
            c1=model.layers * EQ1_B * model.hidden**2 / g,
            c2=model.layers * EQ1_A * model.hidden / g,
        )
        dec = DecodeCoefficients(
            d0=hw.step_overhead + model.weight_bytes / hw.mem_bandwidth,
            d1=2.0 * model.params / g,
            d2=model.kv_bytes_per_token / hw.mem_bandwidth,
        )
        return cls(model, hw, pre, dec, source="analytic")

    def prefill_time(self, prompt_len: int, prefix_len: int = 0) -> float:
        return self.prefill.time(prompt_len, prefix_len)

    def chunked_prefill_time(self, prompt_len: int, prefix_len: int, chunk: int) -> float:
        """Prefill computed ``chunk`` tokens at a time (each chunk pays the fixed overhead)."""
        if chunk <= 0:
            raise ValueError("chunk must be positive")
        t, done = 0.0, prefix_len
        while done < prompt_len:
            end = min(prompt_len, done + chunk)
            t += self.prefill.time(end, done)
            done = end
        return t

    def decode_step_time(self, batch: int, total_context: int) -> float:
        return self.decode.time(batch, total_context)

    def kv_bytes(self, tokens: int) -> int:
        return tokens * self.model.kv_bytes_per_token

    def with_coefficients(
        self,
        prefill: PrefillCoefficients,
        decode: DecodeCoefficients,
        fit_error: dict[str, float] | None = None,
    ) -> CostModel:
        return CostModel(
            self.model, self.hardware, prefill, decode, "fitted", dict(fit_error or {})
        )


def transfer_time(nbytes: float, bandwidth: float, latency: float = 0.0) -> float:
    """Seconds to move ``nbytes`` over a link of ``bandwidth`` bytes/s."""
    if bandwidth <= 0:
        raise ValueError("bandwidth must be positive")
    return 0.0 if nbytes <= 0 else latency + nbytes / bandwidth


def min_reuse_bandwidth(model: ModelSpec, hw: HardwareSpec, prefix_len: int) -> float:
    """Bandwidth (bytes/s) above which loading a cached prefix beats recomputing it (paper §2.2):
    ``B > G * 2*d*s / (gqa * (a*p*d + b*d^2))``."""
    d, s = model.hidden, model.dtype_bytes
    return hw.flops * 2 * d * s / (model.gqa * (EQ1_A * prefix_len * d + EQ1_B * d * d))


# --- fitting ----------------------------------------------------------------------------------


def prefill_features(
    samples: Iterable[tuple[int, int, float]],
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``[1, L-P, L^2-P^2]`` and times of the ``(prompt_len, prefix_len, seconds)``
    samples that computed something (``L > P``)."""
    rows = [(L, P, t) for L, P, t in samples if L > P]
    feats = np.array([[1.0, L - P, L * L - P * P] for L, P, _ in rows]).reshape(-1, 3)
    return feats, np.array([t for *_, t in rows], dtype=float)


def decode_features(
    samples: Iterable[tuple[int, int, float]],
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``[1, batch, context]`` and times of the ``(batch, total_context, seconds)``
    samples with a batch."""
    rows = [(b, c, t) for b, c, t in samples if b > 0]
    feats = np.array([[1.0, b, c] for b, c, _ in rows], dtype=float).reshape(-1, 3)
    return feats, np.array([t for *_, t in rows], dtype=float)


def relative_error(features: np.ndarray, coef: Iterable[float], times: np.ndarray) -> float:
    """Mean ``|predicted - measured| / measured`` (0 without samples)."""
    if not times.size:
        return 0.0
    pred = features @ np.asarray(list(coef), dtype=float)
    return float(np.mean(np.abs(pred - times) / np.maximum(times, 1e-12)))


def fit_least_squares(
    features: np.ndarray, times: np.ndarray, *, relative: bool = False
) -> tuple[float, ...]:
    """The one fitter of the cost model's coefficients from measured times.

    ``relative=False``: ordinary least squares (``kvcake calibrate``: a designed grid).
    ``relative=True`` (the instances' online fit over whatever their window holds): least
    squares of the *relative* error (rows divided by the measured time: short prefills matter
    as much as long ones, as they do for a TTFT SLO), non-negative (coefficients are times per
    unit: a term that fits negative is dropped and the rest refitted), and empty when the
    samples cannot pin every coefficient (rank too low: e.g. decode steps whose context grows
    in proportion to the batch), since such a fit matches the window and extrapolates wildly."""
    if not relative:
        coef, *_ = np.linalg.lstsq(features, times, rcond=None)
        return tuple(float(c) for c in coef)
    if np.linalg.matrix_rank(features) < features.shape[1]:
        return ()
    w = 1.0 / np.maximum(times, 1e-9)
    a, b = features * w[:, None], times * w
    keep = list(range(features.shape[1]))
    while keep:
        coef, *_ = np.linalg.lstsq(a[:, keep], b, rcond=None)
        if (coef >= 0).all():
            out = [0.0] * features.shape[1]
            for k, c in zip(keep, coef, strict=True):
                out[k] = float(c)
            return tuple(out)
        keep.pop(int(np.argmin(coef)))
    return ()


def fit_prefill(samples: Iterable[tuple[int, int, float]]) -> tuple[PrefillCoefficients, float]:
    """Least squares over ``(prompt_len, prefix_len, seconds)``; returns coefficients and the mean
    relative error of the fit."""
    feats, t = prefill_features(samples)
    if len(t) < 3:
        raise ValueError("need at least 3 prefill samples with prompt_len > prefix_len")
    coef = fit_least_squares(feats, t)
    return PrefillCoefficients(*coef), relative_error(feats, coef, t)


def fit_decode(samples: Iterable[tuple[int, int, float]]) -> tuple[DecodeCoefficients, float]:
    """Least squares over ``(batch, total_context, seconds)``."""
    feats, t = decode_features(samples)
    if len(t) < 3:
        raise ValueError("need at least 3 decode samples with batch > 0")
    coef = fit_least_squares(feats, t)
    return DecodeCoefficients(*coef), relative_error(feats, coef, t)


# --- presets and calibration files ------------------------------------------------------------

LLAMA3_70B = ModelSpec("llama3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, params=70.6e9)
SMOLLM2_135M = ModelSpec(
    "smollm2-135m", layers=30, hidden=576, heads=9, kv_heads=3, params=134.5e6, dtype_bytes=4
)
A800X8 = HardwareSpec("8xA800", 8 * 312e12, 0.5, 8 * 2.039e12, 128e9, 100e9, 0.005)
H800X8 = HardwareSpec("8xH800", 8 * 989e12, 0.5, 8 * 3.35e12, 128e9, 400e9, 0.005)
# A rough 2-core CPU; `kvcake calibrate` replaces these numbers with measured ones.
CPU2 = HardwareSpec("cpu-2core", 100e9, 0.3, 10e9, 10e9, 1.25e9, 0.002)

PRESETS: dict[str, tuple[ModelSpec, HardwareSpec]] = {
    "llama3-70b/8xA800": (LLAMA3_70B, A800X8),
    "llama3-70b/8xH800": (LLAMA3_70B, H800X8),
    "smollm2-135m/cpu": (SMOLLM2_135M, CPU2),
    "smollm2-135m/cpu-calibrated": (SMOLLM2_135M, CPU2),
}
DEFAULT_PRESET = "llama3-70b/8xA800"
# Presets whose times were measured, not derived: fitted coefficients replace the analytic ones.
# smollm2-135m/cpu-calibrated: kvcake's torch backend, SmolLM2-135M-Instruct fp32, one torch
# thread, on the 2-vCPU project VM, 2026-12-01 12:27 UTC (`python benchmarks/calibrate_cpu.py`:
# the `kvcake calibrate --backend torch` grid timed by the computing thread's CPU clock, because
# the machine was shared, load average 10-15; fit error prefill 5.0%, decode 5.9%).
CALIBRATED: dict[str, tuple[PrefillCoefficients, DecodeCoefficients]] = {
    "smollm2-135m/cpu-calibrated": (
        PrefillCoefficients(0.1236, 0.002803, 9.249e-07),
        DecodeCoefficients(0.07986, 0.008707, 2.673e-05),
    ),
}


def preset(name: str = DEFAULT_PRESET) -> CostModel:
    try:
        model, hw = PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown cost-model preset {name!r}; choose from {sorted(PRESETS)}"
        ) from None
    cm = CostModel.analytic(model, hw)
    if name in CALIBRATED:
        pre, dec = CALIBRATED[name]
        return cm.with_coefficients(pre, dec)
    return cm


def save_calibration(cm: CostModel, path: str | Path) -> None:
    doc = {
        "model": asdict(cm.model),
        "hardware": asdict(cm.hardware),
        "prefill": asdict(cm.prefill),
        "decode": asdict(cm.decode),
        "source": cm.source,
        "fit_error": cm.fit_error,
    }
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


def load_calibration(path: str | Path) -> CostModel:
    """Load a file written by :func:`save_calibration` (``kvcake calibrate``)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
        cm = CostModel(
            ModelSpec(**doc["model"]),
            HardwareSpec(**doc["hardware"]),
            PrefillCoefficients(**doc["prefill"]),
            DecodeCoefficients(**doc["decode"]),
            str(doc.get("source", "fitted")),
            {str(k): float(v) for k, v in doc.get("fit_error", {}).items()},
        )
    except FileNotFoundError as exc:
        raise ConfigError(f"calibration file {p} not found (run `kvcake calibrate`)") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"calibration file {p} is malformed: {exc!r}") from exc
    for name, v in (*asdict(cm.prefill).items(), *asdict(cm.decode).items()):
        if not math.isfinite(v):
            raise ConfigError(f"calibration file {p}: coefficient {name} is not finite")
    return cm
