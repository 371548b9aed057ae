"""The Conductor: KV-cache-centric scheduling and admission (paper Algorithm 1, arXiv §7).

Pure Python + numpy over ``kvcake.core.api`` snapshots; no sockets, no torch. The simulator and
the live proxy drive the same :class:`Conductor`. See docs/conductor.md.
"""

from kvcake.conductor.admission import (
    ADMISSION_POLICIES,
    KV_FULL,
    NO_DECODE,
    NO_PREFILL,
    PREDICTED_TBT_SLO,
    TBT_SLO,
    TBT_SLO_AFTER_PREFILL,
    TTFT_SLO,
    AdmissionInput,
    AdmissionPolicy,
    make_admission_policy,
)
from kvcake.conductor.conductor import Conductor
from kvcake.conductor.config import ConductorConfig
from kvcake.conductor.decode import DecodeChoice, select_decode
from kvcake.conductor.index import PrefixIndex
from kvcake.conductor.predictors import (
    DecodeTBTModel,
    Predictors,
    PrefillTimeModel,
    TransferTimeModel,
)
from kvcake.conductor.prefill import (
    PREFILL_POLICIES,
    PrefillChoice,
    PrefillPolicy,
    make_prefill_policy,
)
from kvcake.conductor.view import PrefillView, ViewBuilder
from kvcake.core.errors import SchedulingError

__all__ = [
    "ADMISSION_POLICIES",
    "KV_FULL",
    "NO_DECODE",
    "NO_PREFILL",
    "PREDICTED_TBT_SLO",
    "PREFILL_POLICIES",
    "TBT_SLO",
    "TBT_SLO_AFTER_PREFILL",
    "TTFT_SLO",
    "AdmissionInput",
    "AdmissionPolicy",
    "Conductor",
    "ConductorConfig",
    "DecodeChoice",
    "DecodeTBTModel",
    "Predictors",
    "PrefillChoice",
    "PrefillPolicy",
    "PrefillTimeModel",
    "PrefillView",
    "PrefixIndex",
    "SchedulingError",
    "TransferTimeModel",
    "ViewBuilder",
    "make_admission_policy",
    "make_prefill_policy",
    "select_decode",
]
