"""The parts a :class:`~kvcake.compat.mooncake.store.MooncakeDistributedStore` is composed of,
and :func:`via`, which makes a store method its current part's method."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Concatenate, ParamSpec, TypeVar

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
from kvcake.core.via import Via

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


def via(part: str, fn: Callable[Concatenate[Any, P], R]) -> Via[P, R]:
    """``put = via("kv", KvOps.put)`` in the store: ``store.put`` is its current ``kv`` part's
    ``put`` (the parts are swapped as a whole while a dummy is attached)."""
    if part not in PART_NAMES:
        raise TypeError(f"no part {part!r} (parts: {sorted(PART_NAMES)})")
    return Via(f"_parts.{part}", fn)
