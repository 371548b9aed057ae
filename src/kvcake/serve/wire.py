"""The instance RPC wire format: JSON over HTTP, one endpoint per ``core.api.InstanceAPI`` call.

Bodies are the ``core.api`` dataclasses themselves, encoded and validated by ``msgspec`` (so the
proxy, the instances and the simulator share one set of shapes). Endpoints of an instance::

    POST /rpc/reserve_kv   ReserveKV          -> KVReservation
    POST /rpc/prefill      PrefillTask        -> PrefillResult
    POST /rpc/stream       StreamRequest      -> NDJSON stream of TokenChunk (one per line)
    POST /rpc/abort        AbortRequest       -> AbortAck (after the request stopped writing)
    POST /rpc/drain                           -> {}
    GET  /rpc/state?since=N                   -> InstanceState (load report + KV events)
    GET  /rpc/kv                              -> block accounting, checked (tests, debugging)
    GET  /health, GET /metrics

Errors are ``{"error": {"message", "type"}}`` with status 400 (bad input), 409 (unknown or
aborted request), 503 (draining / full) or 500; the client maps them back to exceptions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from kvcake.core.api import (
    KVEvent,
    LoadReport,
    Role,
    SamplingParams,
)
from kvcake.core.errors import KvcakeError
from kvcake.core.ids import InstanceId, RequestId

T = TypeVar("T")


class InstanceError(KvcakeError):
    """An instance refused or failed a call; ``status`` is the HTTP status it answered with."""

    def __init__(self, message: str, status: int = 500, kind: str = "instance_error"):
        super().__init__(message)
        self.status = status
        self.kind = kind


class InstanceUnavailable(InstanceError):
    """The instance cannot be reached (dead, restarting) or is draining."""

    def __init__(self, message: str, instance: str | None = None):
        super().__init__(message, 503, "instance_unavailable")
        self.instance = instance


class BadRequest(InstanceError):
    def __init__(self, message: str):
        super().__init__(message, 400, "invalid_request_error")


@dataclass(frozen=True)
class ReserveKV:
    request_id: RequestId
    num_tokens: int


@dataclass(frozen=True)
class StreamRequest:
    request_id: RequestId
    first_token: int
    prompt_len: int
    sampling: SamplingParams
    # Optional: the prompt itself, so the decode instance can name (and pool) the blocks of
    # prompt + answer when the request ends — a later turn of the conversation reuses them.
    prompt_tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class AbortRequest:
    request_id: RequestId
    # The request's prefill confirmed it writes nothing more into this instance's reservation
    # (the proxy aborted it there first), so reserved blocks may be reused at once; otherwise
    # they are fenced (kept allocated) for a quarantine period.
    writer_stopped: bool = False


@dataclass(frozen=True)
class AbortAck:
    # This instance writes nothing more for the request (a running prefill stopped and every
    # KV write it had submitted resolved).
    stopped: bool = True


@dataclass(frozen=True)
class InstanceInfo:
    """Static facts an instance tells the proxy once (``GET /rpc/info``)."""

    instance_id: InstanceId
    role: Role
    model: str
    block_tokens: int
    kv_bytes_per_token: int
    kv_blocks_total: int
    max_context: int
    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()
    calibration: dict[str, Any] = field(default_factory=dict)  # cost-model coefficients


@dataclass(frozen=True)
class InstanceState:
    load: LoadReport
    events: tuple[KVEvent, ...]
    first_seq: int  # smallest seq still buffered (a gap below it means: resync)
    last_seq: int
    # Cost-model coefficients fitted online from this instance's own prefills / decode steps
    # (serve.online_fit.Fitted.as_dict); the proxy's conductor predicts with them.
    fitted: dict[str, Any] = field(default_factory=dict)


_enc = msgspec.json.Encoder()


def encode(obj: Any) -> bytes:
    return _enc.encode(obj)


def decode(data: bytes | str, tp: type[T]) -> T:
    """Decode and validate; any problem becomes :class:`BadRequest` naming the cause."""
    try:
        return msgspec.json.decode(data, type=tp)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as exc:
        raise BadRequest(f"malformed {tp.__name__}: {exc}") from exc


def error_body(message: str, kind: str) -> bytes:
    return encode({"error": {"message": message, "type": kind}})
