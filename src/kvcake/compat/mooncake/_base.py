"""Shared pieces of the Mooncake store shim: the error-to-return-code wrapper, buffer views on
integer addresses, ReplicateConfig -> PutOptions, and :class:`Conn`, what ``setup`` made (the
kvcake client) with the write path every put family shares.

Mooncake's convention, mirrored here: nothing raises past a method except a TypeError for a call
that does not match the signature (pybind11 refuses those before the C++ runs); everything else is
an integer code (0 ok, negative error) or the method's empty value (``b""``, ``None``, ``[]``)."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from kvcake.compat.mooncake._types import ReplicateConfig, SoftPinAction
from kvcake.core.errors import KvcakeError, StoreError
from kvcake.store import errors as E
from kvcake.store.client import Client
from kvcake.store.protocol import PutOptions

F = TypeVar("F", bound=Callable[..., Any])
BUFFER_OVERFLOW = -10
TASK_NOT_FOUND = -1400
FILE_ERROR = -1100


def returns(on_error: Any) -> Callable[[F], F]:
    """Turn kvcake's exceptions into Mooncake's return value: the error code for int-returning
    methods (``on_error is int``), ``on_error`` itself (``b""``, ``None``, ``[]``) otherwise."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(self: Part, *args: Any, **kw: Any) -> Any:
            if self._conn.client is None:
                return E.INTERNAL_ERROR if on_error is int else _fresh(on_error)
            try:
                return fn(self, *args, **kw)
            except StoreError as exc:
                return exc.code if on_error is int else _fresh(on_error)
            except (KvcakeError, ValueError, OverflowError, OSError):
                return E.INVALID_PARAMS if on_error is int else _fresh(on_error)

        return wrapper  # type: ignore[return-value]

    return deco


def _fresh(value: Any) -> Any:
    return [] if isinstance(value, list) else {} if isinstance(value, dict) else value


def check_signature(*args: Any, kinds: Sequence[type | tuple[type, ...]]) -> None:
    """pybind11's argument check: a wrong type is a TypeError before anything runs."""
    for a, k in zip(args, kinds, strict=False):
        if not isinstance(a, k) or (k is int and isinstance(a, bool)):
            raise TypeError(f"incompatible function arguments: got {type(a).__name__}")


def view(ptr: int, size: int) -> memoryview:
    if not isinstance(ptr, int) or not isinstance(size, int) or ptr <= 0 or size < 0:
        raise E.InvalidParams(f"bad buffer address {ptr!r} / size {size!r}")
    if size == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * size).from_address(ptr)).cast("B")


def options(config: ReplicateConfig | None) -> PutOptions:
    """Mooncake refuses a soft-pin TTL without ``soft_pin_action = ENABLE`` (-600)."""
    if config is None:
        return DEFAULT_OPTIONS
    c = config
    if not isinstance(c, ReplicateConfig):
        raise TypeError("config must be a ReplicateConfig")
    action = SoftPinAction(c.soft_pin_action)
    if c.soft_pin_ttl_ms is not None and action is not SoftPinAction.ENABLE:
        raise E.InvalidParams("soft_pin_ttl_ms needs soft_pin_action = ENABLE")
    if c.replica_num < 1 or (c.soft_pin_ttl_ms is not None and c.soft_pin_ttl_ms <= 0):
        raise E.InvalidParams("replica_num must be >= 1 and soft_pin_ttl_ms > 0")
    preferred = c.preferred_segments + ([c.preferred_segment] if c.preferred_segment else [])
    return PutOptions(
        replica_num=c.replica_num,
        hard_pin=c.with_hard_pin,
        soft_pin=action.name.lower(),
        soft_pin_ttl_ms=c.soft_pin_ttl_ms or 0,
        preferred_segments=preferred,
    )


DEFAULT_OPTIONS = PutOptions()  # what a default ReplicateConfig() maps to (frozen: shared)


def check_key(key: Any) -> None:
    if not isinstance(key, str):
        raise TypeError(f"key must be str, got {type(key).__name__}")


class Conn:
    """What ``setup`` made, shared by the store's parts: the kvcake client (``None`` before setup
    and after close), the in-process store server when the store is a storage node (its client
    is ``client``), the segment name Mooncake calls the hostname, and the local buffer's size
    (Mooncake's ``local_buffer_size``: the largest value a put takes). Also the one write path
    (``put``, ``put_batch``) and plain read (``get_or_none``) every method family shares.

    Thread safety: as the kvcake client's (calls from many threads are fine); ``setup`` and
    ``close`` must not race other calls, as with the wheel. Owns no memory: values are the
    callers' buffers, viewed for the duration of a call."""

    def __init__(self) -> None:
        self.client: Client | None = None
        self.server: Any = None  # kvcake.store.server.StoreServer (imported on use)
        self.hostname = ""
        self.local_buffer = 0

    @property
    def c(self) -> Client:
        assert self.client is not None
        return self.client

    def get_or_none(self, key: str) -> bytearray | None:
        """The value, or None for an empty key or any store error."""
        if not key:
            return None
        try:
            return self.c.get(key)
        except StoreError:
            return None

    def put(self, key: str, data: memoryview, config: ReplicateConfig | None, upsert: bool) -> int:
        opts = options(config)
        if not key or data.nbytes == 0:
            return E.INVALID_PARAMS
        if data.nbytes > self.local_buffer:
            return E.INVALID_PARAMS if self.local_buffer == 0 else BUFFER_OVERFLOW
        try:
            (self.c.upsert if upsert else self.c.put)(key, data, opts)
        except E.ObjectAlreadyExists:
            return 0  # Mooncake: put never overwrites and still reports success
        return 0

    def put_batch(
        self,
        keys: Sequence[str],
        views: Sequence[memoryview],
        config: ReplicateConfig | None,
        upsert: bool,
    ) -> list[int]:
        """Per-key codes; -600 for every key when lengths differ or keys repeat."""
        opts = options(config)
        if len(keys) != len(views):
            return [E.INVALID_PARAMS] * len(keys)
        codes = [0] * len(keys)
        ok = []
        for i, (k, v) in enumerate(zip(keys, views, strict=True)):
            if not k or v.nbytes == 0 or v.nbytes > max(self.local_buffer, 0):
                codes[i] = E.INVALID_PARAMS
            else:
                ok.append(i)
        if len({keys[i] for i in ok}) != len(ok):
            return [E.INVALID_PARAMS] * len(keys)
        if not ok:
            return codes
        sub_k, sub_v = [keys[i] for i in ok], [views[i] for i in ok]
        if upsert:
            results = self.c.writes.put_many(sub_k, sub_v, opts, upsert=True)
        else:
            results = self.c.batch_put(sub_k, sub_v, opts)
        for i, res in zip(ok, results, strict=True):
            if res is not None and not isinstance(res, E.ObjectAlreadyExists):
                codes[i] = res.code
        return codes


class Part(Protocol):
    """A part of the store facade: every one reaches the client through the shared Conn."""

    _conn: Conn
