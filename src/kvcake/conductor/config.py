"""The conductor's settings: one frozen, validated dataclass (load it with
``kvcake.core.config.load_config(ConductorConfig, toml_path=..., section="conductor")``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvcake.core.config import require


def _names(kind: str) -> tuple[str, ...]:
    # Imported lazily: the registries import this module's users, not the other way round.
    if kind == "prefill":
        from kvcake.conductor.prefill import PREFILL_POLICIES

        return tuple(sorted(PREFILL_POLICIES))
    from kvcake.conductor.admission import ADMISSION_POLICIES

    return tuple(sorted(ADMISSION_POLICIES))


@dataclass(frozen=True)
class ConductorConfig:
    """How the conductor picks instances and when it rejects.

    * ``prefill_policy``: a name in ``PREFILL_POLICIES`` (random, round-robin, least-load,
      local-cache-aware, global-cache-aware).
    * ``admission_policy``: a name in ``ADMISSION_POLICIES`` (none, per-stage, early-rejection,
      prediction).
    * ``ttft_slo_s`` / ``tbt_slo_s``: the service-level objectives admission compares with.
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

    prefill_policy: str = "global-cache-aware"
    admission_policy: str = "none"
    ttft_slo_s: float = 30.0
    tbt_slo_s: float = 0.3
    kvcache_balancing_threshold: float = 1.2
    uniform_decode_s: float = 0.0
    expected_output_tokens: int = 256
    seed: int = 0
    colocated: bool = False

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
