"""Shared pieces of the Mooncake shim: config types, the error-to-return-code wrapper and
the base class holding the kvcake client."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Any, TypeVar

from kvcake.core.errors import KvcakeError, StoreError
from kvcake.store import errors as E
from kvcake.store.client import Client
from kvcake.store.protocol import PutOptions

F = TypeVar("F", bound=Callable[..., Any])


class SoftPinAction(IntEnum):
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ReplicateConfig:
    def __init__(self) -> None:
        self.replica_num = 1
        self.with_hard_pin = False
        self.with_soft_pin = False  # older spelling of soft_pin_action=ENABLE
        self.soft_pin_action = SoftPinAction.PRESERVE
        self.soft_pin_ttl_ms = 0
        self.preferred_segments: list[str] = []
        self.preferred_segment = ""

    def options(self) -> PutOptions:
        action = SoftPinAction.ENABLE if self.with_soft_pin else self.soft_pin_action
        preferred = list(self.preferred_segments) + (
            [self.preferred_segment] if self.preferred_segment else []
        )
        return PutOptions(
            replica_num=int(self.replica_num),
            hard_pin=bool(self.with_hard_pin),
            soft_pin=SoftPinAction(action).name.lower(),
            soft_pin_ttl_ms=int(self.soft_pin_ttl_ms),
            preferred_segments=preferred,
        )


def _returns(on_error: Any) -> Callable[[F], F]:
    """Turn exceptions into Mooncake's return value: the error code for int-returning methods,
    ``on_error`` (e.g. ``b""``) otherwise. Nothing escapes to the caller."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(self: StoreBase, *args: Any, **kw: Any) -> Any:
            if self._client is None:
                return on_error if on_error is not int else E.INTERNAL_ERROR
            try:
                return fn(self, *args, **kw)
            except StoreError as exc:
                return on_error if on_error is not int else exc.code
            except (KvcakeError, TypeError, ValueError, OverflowError):
                return on_error if on_error is not int else E.INVALID_PARAMS

        return wrapper  # type: ignore[return-value]

    return deco


def _view(ptr: int, size: int) -> memoryview:
    if not isinstance(ptr, int) or not isinstance(size, int) or ptr <= 0 or size <= 0:
        raise E.InvalidParams(f"bad buffer address {ptr!r} / size {size!r}")
    return memoryview((ctypes.c_char * size).from_address(ptr)).cast("B")


def _check_kv(key: Any, size: int) -> None:
    if not isinstance(key, str) or not key or size <= 0:
        raise E.InvalidParams("empty key or value")


class StoreBase:
    def __init__(self) -> None:
        self._client: Client | None = None
        self._hostname = ""
        self._local_buffer = 0
        self._registered: dict[int, int] = {}

    @property
    def client(self) -> Client:
        assert self._client is not None
        return self._client

    def _put(self, key: Any, view: memoryview, config: ReplicateConfig | None, upsert: bool) -> int:
        _check_kv(key, view.nbytes)
        if view.nbytes > self._local_buffer:
            return E.INVALID_PARAMS if self._local_buffer == 0 else -10  # BUFFER_OVERFLOW
        opts = (config or ReplicateConfig()).options()
        try:
            if upsert:
                self.client.upsert(key, view, opts)
            else:
                self.client.put(key, view, opts)
        except E.ObjectAlreadyExists:
            return 0  # Mooncake: put never overwrites and still reports success
        return 0

    def _put_batch(
        self,
        keys: Sequence[str],
        views: Sequence[memoryview],
        config: ReplicateConfig | None,
        upsert: bool,
    ) -> list[int]:
        if len(keys) != len(views) or not keys:
            return [E.INVALID_PARAMS] * max(len(keys), 1)
        codes = [0] * len(keys)
        ok = []
        for i, (k, v) in enumerate(zip(keys, views, strict=True)):
            try:
                _check_kv(k, v.nbytes)
                ok.append(i)
            except E.InvalidParams:
                codes[i] = E.INVALID_PARAMS
        if len({keys[i] for i in ok}) != len(ok):
            return [E.INVALID_PARAMS] * len(keys)
        opts = (config or ReplicateConfig()).options()
        sub_k, sub_v = [keys[i] for i in ok], [views[i] for i in ok]
        results = (
            self.client.batch_upsert(sub_k, sub_v)
            if upsert
            else self.client.batch_put(sub_k, sub_v, opts)
        )
        for i, res in zip(ok, results, strict=True):
            if res is not None and not isinstance(res, E.ObjectAlreadyExists):
                codes[i] = res.code
        return codes
