"""The parts a :class:`~kvcake.compat.mooncake.store.MooncakeDistributedStore` is composed of,
and :func:`via`, which makes a facade method its current part's method."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from kvcake.compat.mooncake._base import Conn
from kvcake.compat.mooncake._kv import KvOps
from kvcake.compat.mooncake._parallel import TpTensors
from kvcake.compat.mooncake._parallelism import ParTensors
from kvcake.compat.mooncake._pointers import PointerOps
from kvcake.compat.mooncake._replicas import Replicas
from kvcake.compat.mooncake._segments import Segments
from kvcake.compat.mooncake._sessions import Sessions
from kvcake.compat.mooncake._setup import Lifecycle
from kvcake.compat.mooncake._tensors import Tensors

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Parts:
    """One store's parts. All share the store's Conn; ``ptr`` and ``life`` also share its
    registered-buffer table. A dummy store (``_dummy_store``) swaps in its own ``life``, ``kv``,
    ``ptr``, ``sessions`` and ``replicas`` and keeps the others."""

    life: Lifecycle
    segments: Segments
    kv: KvOps
    ptr: PointerOps
    sessions: Sessions
    replicas: Replicas
    tensors: Tensors
    tp: TpTensors
    par: ParTensors

    @classmethod
    def plain(cls, conn: Conn, registered: dict[int, int]) -> Parts:
        tensors = Tensors(conn)
        tp = TpTensors(conn, tensors)
        return cls(
            life=Lifecycle(conn, registered),
            segments=Segments(conn),
            kv=KvOps(conn),
            ptr=PointerOps(conn, registered),
            sessions=Sessions(conn),
            replicas=Replicas(conn),
            tensors=tensors,
            tp=tp,
            par=ParTensors(conn, tensors, tp),
        )


PART_NAMES = frozenset(f.name for f in fields(Parts))


class Via(Generic[P, R]):
    """``put = via("kv", KvOps.put)`` in the facade: ``store.put`` is the bound ``put`` of the
    store's current ``kv`` part (its exact signature, no wrapper in between); on the class it is
    a plain function taking the store first."""

    def __init__(self, part: str, fn: Callable[Concatenate[Any, P], R]) -> None:
        if part not in PART_NAMES:
            raise TypeError(f"no part {part!r} (parts: {sorted(PART_NAMES)})")
        self.part, self.name = part, fn.__name__
        self._fn = fn

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.name:  # a method serves under its own name only (no aliasing slips)
            raise TypeError(f"{owner.__name__}.{name} is via {self.part}.{self.name}")

    @overload
    def __get__(self, obj: None, owner: type) -> Callable[Concatenate[Any, P], R]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Callable[P, R]: ...
    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self._unbound()
        return getattr(getattr(obj._parts, self.part), self.name)

    def _unbound(self) -> Callable[..., R]:
        part, name = self.part, self.name

        @functools.wraps(self._fn)
        def call(store: Any, *args: Any, **kwargs: Any) -> R:
            method: Callable[..., R] = getattr(getattr(store._parts, part), name)
            return method(*args, **kwargs)

        return call


def via(part: str, fn: Callable[Concatenate[Any, P], R]) -> Via[P, R]:
    return Via(part, fn)
