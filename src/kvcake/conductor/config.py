"""The conductor's settings: one frozen, validated dataclass and one ``[conductor]`` TOML section,
read by :func:`load_conductor_config` for both the simulator (``SimConfig.conductor``) and the
live proxy (``ProxyConfig.conductor``)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from kvcake.conductor.admission import ADMISSION_POLICIES
from kvcake.conductor.prefill import PREFILL_POLICIES
from kvcake.core.config import load_config, read_toml, require, setting
from kvcake.core.errors import ConfigError

SECTION = "conductor"

V = TypeVar("V")


def _names(kind: str) -> tuple[str, ...]:
    if kind == "prefill":
        return tuple(sorted(PREFILL_POLICIES))
    return tuple(sorted(ADMISSION_POLICIES))


@dataclass(frozen=True)
class ConductorConfig:
    """How the conductor picks instances and when it rejects.

    * ``prefill_policy``: a name in ``PREFILL_POLICIES`` (random, round-robin, least-load,
      local-cache-aware, global-cache-aware).
    * ``admission_policy``: a name in ``ADMISSION_POLICIES`` (none, per-stage, early-rejection,
      prediction).
    * ``ttft_slo_s`` / ``tbt_slo_s``: the service-level objectives admission compares with.
    * ``ttft_headroom``: admission accepts a request only if its predicted TTFT is within
      ``ttft_slo_s * (1 - ttft_headroom)``: predictions are right to a few percent at best, so
      one predicted a hair under the SLO misses it about half the time.
    * ``kvcache_balancing_threshold``: Algorithm 1 fetches a remote prefix when
      ``best_len / local_len > threshold`` (``local_len == 0`` counts as infinitely better).
    * ``uniform_decode_s``: the decode duration t_d that prediction-based admission assumes for
      every request; 0 means ``expected_output * predicted TBT`` of the request itself.
    * ``expected_output_tokens``: the output length the conductor *predicts* for a request
      (decode KV fit, decode duration) — capped by the request's ``max_tokens``, which is a
      limit, not a prediction.
    * ``seed``: seeds the random policy.
    * ``colocated``: prefill and decode run on the same instance (vLLM-like baseline); the decode
      instance is then the ``DecodeState`` with the prefill instance's id.
    """

    prefill_policy: str = setting(
        "global-cache-aware",
        (
            "conductor prefill policy: random, round-robin, least-load, "
            "local-cache-aware, global-cache-aware"
        ),
    )
    admission_policy: str = setting(
        "none", "conductor admission: none, per-stage, early-rejection, prediction"
    )
    ttft_slo_s: float = setting(30.0, "TTFT SLO in s (admission, effective-request metric)")
    tbt_slo_s: float = setting(0.3, "TBT SLO in s (admission, effective-request metric)")
    ttft_headroom: float = setting(
        0.03, "admission accepts only predicted TTFTs <= ttft_slo_s x (1 - this)"
    )
    kvcache_balancing_threshold: float = setting(
        1.2,
        "Algorithm 1: fetch a remote prefix when it is this many times longer than the local one",
    )
    uniform_decode_s: float = setting(
        0.0,
        (
            "prediction admission's uniform decode time t_d in s "
            "(0: expected output tokens x predicted TBT)"
        ),
    )
    expected_output_tokens: int = setting(
        256, "output length the conductor assumes (it never sees the real one)"
    )
    seed: int = setting(
        0, "seed of the conductor's random policy (and the simulator's predictor noise)"
    )
    colocated: bool = setting(
        False, "prefill and decode on one instance (set from sim.system / cluster.colocated)"
    )

    def __post_init__(self) -> None:
        prefill, admission = _names("prefill"), _names("admission")
        require(
            self.prefill_policy in prefill,
            f"conductor.prefill_policy must be one of {', '.join(prefill)}, "
            f"got {self.prefill_policy!r}",
        )
        require(
            self.admission_policy in admission,
            f"conductor.admission_policy must be one of {', '.join(admission)}, "
            f"got {self.admission_policy!r}",
        )
        for name in ("ttft_slo_s", "tbt_slo_s"):
            v = getattr(self, name)
            require(math.isfinite(v) and v > 0, f"conductor.{name} must be > 0, got {v}")
        h = self.ttft_headroom
        require(0 <= h < 0.5, f"conductor.ttft_headroom must be in [0, 0.5), got {h}")
        t = self.kvcache_balancing_threshold
        require(
            math.isfinite(t) and t >= 1.0,
            f"conductor.kvcache_balancing_threshold must be a finite ratio >= 1, got {t}",
        )
        require(
            self.expected_output_tokens >= 1,
            f"conductor.expected_output_tokens must be >= 1, got {self.expected_output_tokens}",
        )
        u = self.uniform_decode_s
        require(math.isfinite(u) and u >= 0, f"conductor.uniform_decode_s must be >= 0, got {u}")


# Keys that lived in [sim] / [proxy] before the one [conductor] section: a clear error, not a
# silently ignored or generic "unknown setting".
_SIM_MOVED = (
    "prefill_policy",
    "admission_policy",
    "kvcache_balancing_threshold",
    "uniform_decode_s",
    "ttft_slo_s",
    "tbt_slo_s",
    "expected_output_tokens",
    "seed",
)
MOVED: dict[str, dict[str, str]] = {
    "sim": {n: n for n in _SIM_MOVED},
    "proxy": {
        "policy": "prefill_policy",
        "admission": "admission_policy",
        "ttft_slo_s": "ttft_slo_s",
        "tbt_slo_s": "tbt_slo_s",
    },
}


def reject_moved(section: str, keys: Iterable[str], where: str) -> None:
    """``ConfigError`` naming the new key when ``keys`` holds a ``[section]`` key that moved."""
    moved = MOVED.get(section, {})
    bad = [k for k in keys if k in moved]
    if bad:
        fix = ", ".join(f"{section}.{k} -> [conductor] {moved[k]}" for k in bad)
        raise ConfigError(f"{where}: moved to the [conductor] section: {fix}")


def check_moved(toml_path: str | os.PathLike[str] | None, section: str) -> None:
    """Reject keys of ``[section]`` in ``toml_path`` that now live in ``[conductor]``."""
    if toml_path is None:
        return
    data = read_toml(toml_path).get(section, {})
    if isinstance(data, dict):
        reject_moved(section, data, str(toml_path))


def split_overrides(values: Mapping[str, V]) -> tuple[dict[str, V], dict[str, V]]:
    """Flat flag values -> ``(conductor fields, the rest)``; the names are disjoint."""
    names = {f.name for f in dataclasses.fields(ConductorConfig)}
    cond = {k: v for k, v in values.items() if k in names}
    return cond, {k: v for k, v in values.items() if k not in names}


def load_conductor_config(
    toml_path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
) -> ConductorConfig:
    """The one loader: defaults < ``[conductor]`` of ``toml_path`` < ``KVCAKE_CONDUCTOR_<FIELD>``
    < ``overrides`` (``None`` values ignored)."""
    return load_config(
        ConductorConfig, toml_path=toml_path, section=SECTION, env=env, overrides=overrides
    )
