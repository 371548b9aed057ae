"""The instance RPC wire format: JSON over HTTP, one endpoint per ``core.api.InstanceAPI`` call.

Bodies are the ``core.api`` dataclasses themselves, encoded and validated by ``msgspec`` (so the
proxy, the instances and the simulator share one set of shapes). Endpoints of an instance::

    POST /rpc/prefill      PrefillTask        -> PrefillResult              (proxy -> prefill)
    POST /rpc/reserve_kv   ReserveKV          -> KVReservation              (prefill -> decode)
    POST /rpc/stream       StreamRequest      -> NDJSON stream of TokenChunk (proxy -> decode)
    POST /rpc/abort        AbortRequest       -> AbortAck (after the request stopped writing)
    POST /rpc/drain                           -> {}
    GET  /rpc/state?since=N                   -> InstanceState (load report + KV events)
    GET  /rpc/kv                              -> block accounting, checked (tests, debugging)
    GET  /health, GET /metrics

The request path says each thing once: the prompt goes from the proxy in the ``PrefillTask``
only, and the prefill instance hands it to the decode instance with its ``ReserveKV`` (the one
call that gets the reservation, which thus never passes through the proxy); the proxy's
``StreamRequest`` names the request and its first token.

Errors are ``{"error": {"message", "type"}}`` (plus ``instance`` when an *other* instance
failed: a prefill whose decode peer was unreachable names it) with status 400 (bad input), 409
(unknown or aborted request), 503 (draining / full) or 500; :func:`raise_for` maps them back to
exceptions.
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
from kvcake.core.auth import resolve
from kvcake.core.errors import KvcakeError
from kvcake.core.http_auth import INSTANCE_HTTP
from kvcake.core.ids import BlockHash, InstanceId, RequestId
from kvcake.net.httpserve import client_auth as sign

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
    """Sent by the prefill instance. The prompt comes along: the decode instance decodes from
    it, recomputes it after a preemption and names prompt + answer blocks (continuing the chain
    of ``block_hashes``, which it does not recompute)."""

    request_id: RequestId
    num_tokens: int
    prompt_tokens: tuple[int, ...]
    block_hashes: tuple[BlockHash, ...]
    sampling: SamplingParams


@dataclass(frozen=True)
class StreamRequest:
    """Sent by the proxy once the prefill answered: the decode instance has the rest."""

    request_id: RequestId
    first_token: int


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


def error_body(message: str, kind: str, instance: str | None = None) -> bytes:
    err: dict[str, Any] = {"message": message, "type": kind}
    if instance:
        err["instance"] = instance
    return encode({"error": err})


def raise_for(status: int, body: bytes, who: str, iid: str | None = None) -> None:
    """Raise the exception an error answer of instance ``iid`` stands for: 503 (but a full KV)
    is :class:`InstanceUnavailable`, naming the instance the body names (a peer of ``iid``)
    or else ``iid``."""
    try:
        err: dict[str, Any] = decode(body, dict)["error"]
        msg, kind = str(err.get("message")), str(err.get("type"))
        iid = str(err.get("instance") or "") or iid
    except Exception:
        msg, kind = body[:200].decode(errors="replace"), "instance_error"
    if status == 503 and kind != "kv_full":
        raise InstanceUnavailable(f"{who}: {msg}", iid)
    raise InstanceError(f"{who}: {msg}", status, kind)


def client_auth() -> Any:
    """The shared secret's HMAC header on every instance call (None without a secret): the
    proxy's calls and a prefill instance's calls to its decode peer."""

    return sign(resolve(None), INSTANCE_HTTP)
