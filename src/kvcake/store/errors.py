"""Typed store errors. Each carries the Mooncake error code it corresponds to (``.code``), so the
Mooncake-compatible shim can turn any of them into Mooncake's integer return value."""

from __future__ import annotations

from kvcake.core.errors import StoreError as StoreError  # re-exported: the store errors' base

OK = 0
INTERNAL_ERROR = -1
SEGMENT_NOT_FOUND = -101
SEGMENT_ALREADY_EXISTS = -102
CLIENT_NOT_FOUND = -103
NO_AVAILABLE_HANDLE = -200
INVALID_KEY = -400
INVALID_PARAMS = -600
REPLICA_IS_NOT_READY = -703
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
OBJECT_HAS_LEASE = -706
LEASE_EXPIRED = -707
TRANSFER_FAIL = -800
CHECKSUM_MISMATCH = -801
RPC_FAIL = -900
RPC_TIMEOUT = -901
QUOTA_EXCEEDED = -2001  # kvcake's own (Mooncake has no tenants)
SPACE_PENDING = -2002  # kvcake's own: never leaves the client (it retries, then NoSpace)


class InternalError(StoreError):
    default_code = INTERNAL_ERROR

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message, self.default_code if code is None else code)


class SegmentNotFound(InternalError):
    default_code = SEGMENT_NOT_FOUND


class SegmentAlreadyExists(InternalError):
    """A segment of that name is mounted by another client the master believes alive (its
    lease holds, and no pid check or same-host successor said it died). Mooncake's -102."""

    default_code = SEGMENT_ALREADY_EXISTS

    def __init__(
        self, message: str, code: int | None = None, holder: tuple[str, str] | None = None
    ):
        super().__init__(message, code)
        # (owner, host_id) of the name's holder, when the master said (a refused mount): what
        # a restarted node checks before it reports its dead predecessor (store/owners.py)
        self.holder = holder


class NoSpace(InternalError):
    """No segment can hold the object even after eviction (everything leased, pinned, busy)."""

    default_code = NO_AVAILABLE_HANDLE


class SpacePending(NoSpace):
    """No room now, but offloads to disk are in flight that will free memory. The master
    raises it instead of dropping objects it could offload; the client retries the put for
    ``client.space_wait_s`` and then reports a plain :class:`NoSpace` (Mooncake's -200)."""

    default_code = SPACE_PENDING


class QuotaExceeded(NoSpace):
    """A put would take its tenant past its byte quota (issue 15 §4); nothing is evicted for it."""

    default_code = QUOTA_EXCEEDED


class InvalidParams(InternalError):
    """Empty key or value, mismatched batch lengths, a buffer too small, a bad size."""

    default_code = INVALID_PARAMS


class ReplicaNotReady(InternalError):
    default_code = REPLICA_IS_NOT_READY


class ObjectNotFound(InternalError):
    default_code = OBJECT_NOT_FOUND


class ObjectAlreadyExists(InternalError):
    default_code = OBJECT_ALREADY_EXISTS


class ObjectHasLease(InternalError):
    default_code = OBJECT_HAS_LEASE


class LeaseExpired(InternalError):
    default_code = LEASE_EXPIRED


class TransferFailed(InternalError):
    default_code = TRANSFER_FAIL


class WriteLeaseExpired(TransferFailed):
    """A writer's copy would start later than its write lease allows (store/fences.py): its
    range may belong to another put by now, so it writes nothing."""


class ChecksumMismatch(InternalError):
    default_code = CHECKSUM_MISMATCH


class IntegrityError(ChecksumMismatch):
    """No replica of an object verified against its checksums (core/integrity.py): every copy
    the reader tried was corrupt, another key's bytes or unverifiable. Mooncake's -801."""


class RpcFailed(InternalError):
    """The master (or a storage node) could not be reached or answered garbage."""

    default_code = RPC_FAIL


class Unauthorized(RpcFailed):
    """The master refused this client's shared secret, or wants one it lacks (issue 15 §3;
    Mooncake has no code for it: -900 like any unreachable master). Never retried."""


_BY_CODE: dict[int, type[InternalError]] = {
    c.default_code: c
    for c in (
        InternalError,
        SegmentNotFound,
        SegmentAlreadyExists,
        NoSpace,
        SpacePending,
        QuotaExceeded,
        InvalidParams,
        ReplicaNotReady,
        ObjectNotFound,
        ObjectAlreadyExists,
        ObjectHasLease,
        LeaseExpired,
        TransferFailed,
        ChecksumMismatch,
        RpcFailed,
    )
}


def error_for(code: int, message: str) -> InternalError:
    """The typed exception for a Mooncake error code received over the wire."""
    return _BY_CODE.get(code, InternalError)(message, code)
