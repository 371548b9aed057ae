"""``ParallelAxis`` / ``TensorParallelism`` / ``ReadTarget`` and the wheel's rules for them,
as observed on 0.3.13.post1: axis kinds ``dp``, ``tp``, ``ep``, ``pp`` (any case; ``""`` is not
one); ``0 <= rank < size``; each kind at most once; ``tp`` needs ``split_dim``, ``dp``/``ep``/
``pp`` must not have one; ``ep`` needs ``expert_id``, ``pp`` needs ``stage_id``. A stored
shard's header lists the axes in the caller's order; its name lists them in the canonical
order dp, tp, ep, pp (so a read may give them in any order): a single tp axis is
``{key}_tp_{rank}`` (the ``_with_tp`` family's name), anything else
``{key}__dp_1of2__tp_0of2_sd1__ep_0of2_eid3__pp_1of4_sid1`` (the axes present)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcake.compat.mooncake import _tensor_meta as M
from kvcake.store import errors as E

MODES = ("as_stored", "shard", "full")


class _Field:
    """A typed attribute, as pybind11 properties are: a wrong type raises ``TypeError``."""

    def __init__(self, kinds: tuple[type, ...], default: Any, optional: bool = False) -> None:
        self.kinds, self.default, self.optional = kinds, default, optional

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = "_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj, self.name, self.default)

    def __set__(self, obj: Any, value: Any) -> None:
        if not (value is None and self.optional) and (
            not isinstance(value, self.kinds) or isinstance(value, bool)
        ):
            raise TypeError(f"{self.name[1:]}: incompatible function arguments ({value!r})")
        setattr(obj, self.name, self._normal(value))

    def _normal(self, value: Any) -> Any:
        return value


class _Mode(_Field):
    def _normal(self, value: Any) -> Any:
        return value.lower()  # the wheel stores "SHARD" as "shard"


class ParallelAxis:
    kind = _Field((str,), "")
    rank = _Field((int,), 0)
    size = _Field((int,), 1)
    split_dim = _Field((int,), None, optional=True)
    expert_id = _Field((int,), None, optional=True)
    stage_id = _Field((int,), None, optional=True)


class TensorParallelism:
    def __init__(self) -> None:
        self._axes: list[ParallelAxis] = []

    @property
    def axes(self) -> list[ParallelAxis]:
        return list(self._axes)  # a copy, as pybind11's list property: append() does not stick

    @axes.setter
    def axes(self, value: Any) -> None:
        axes = list(value)
        if not all(isinstance(a, ParallelAxis) for a in axes):
            raise TypeError("axes: incompatible function arguments (a list of ParallelAxis)")
        self._axes = axes


class ReadTarget:
    mode = _Mode((str,), "as_stored")

    def __init__(self) -> None:
        self.parallelism: TensorParallelism | None = None


@dataclass(frozen=True)
class AxisSpec:
    kind: str
    rank: int
    size: int
    split_dim: int | None
    expert_id: int | None
    stage_id: int | None

    @property
    def code(self) -> int:
        return M.KINDS.index(self.kind)

    def suffix(self) -> str:
        out = f"{self.kind}_{self.rank}of{self.size}"
        for tag, value in (("sd", self.split_dim), ("eid", self.expert_id), ("sid", self.stage_id)):
            out += "" if value is None else f"_{tag}{value}"
        return out

    def stored(self) -> M.Axis:
        tag = self.expert_id if self.kind == "ep" else self.stage_id if self.kind == "pp" else 0
        sd = -1 if self.split_dim is None else self.split_dim
        return M.Axis(self.code, self.rank, self.size, sd, tag or 0)


def parse(par: Any) -> tuple[AxisSpec, ...]:
    """The validated axes of a ``TensorParallelism`` (in the caller's order); InvalidParams
    (-600) for anything the wheel refuses."""
    try:
        raw = list(par.axes)
        axes = [
            AxisSpec(a.kind.lower(), a.rank, a.size, a.split_dim, a.expert_id, a.stage_id)
            for a in raw
        ]
    except (AttributeError, TypeError):
        raise E.InvalidParams("parallelism must be a TensorParallelism") from None
    if not 0 < len(axes) <= M.MAX_AXES:
        raise E.InvalidParams(f"parallelism needs 1 to {M.MAX_AXES} axes, got {len(axes)}")
    for a in axes:
        _check_axis(a)
    if len({a.kind for a in axes}) != len(axes):
        raise E.InvalidParams("duplicate axis kinds are not supported")
    return tuple(axes)


def canonical(axes: tuple[Any, ...]) -> tuple[Any, ...]:
    """Axes (specs or stored ones) in the order dp, tp, ep, pp."""
    return tuple(sorted(axes, key=lambda a: a.code if isinstance(a, AxisSpec) else a.kind))


def _check_axis(a: AxisSpec) -> None:
    if a.kind not in M.KINDS:
        raise E.InvalidParams(f"unsupported axis kind {a.kind!r} (dp, tp, ep, pp)")
    if not (a.size > 0 and 0 <= a.rank < a.size):
        raise E.InvalidParams(f"invalid rank/size {a.rank}/{a.size} for axis {a.kind}")
    if (a.split_dim is None) == (a.kind == "tp"):
        raise E.InvalidParams("a tp axis requires split_dim; dp, ep and pp axes must not have one")
    if a.kind == "ep" and a.expert_id is None:
        raise E.InvalidParams("an ep axis requires expert_id")
    if a.kind == "pp" and a.stage_id is None:
        raise E.InvalidParams("a pp axis requires stage_id")


def single_tp(axes: tuple[AxisSpec, ...]) -> AxisSpec | None:
    return axes[0] if len(axes) == 1 and axes[0].kind == "tp" else None


def object_key(key: str, axes: tuple[AxisSpec, ...]) -> str:
    tp = single_tp(axes)
    if tp is not None:
        return f"{key}_tp_{tp.rank}"
    return key + "".join("__" + a.suffix() for a in canonical(axes))


def target(t: Any) -> tuple[str, tuple[AxisSpec, ...] | None]:
    """(mode, axes) of a ReadTarget (None: as stored). An unknown mode raises RuntimeError, as
    the wheel does; a malformed target or parallelism is InvalidParams (the read gives None)."""
    if t is None:
        return "as_stored", None
    if not (hasattr(t, "mode") and hasattr(t, "parallelism")):
        raise E.InvalidParams("target must be a ReadTarget")
    mode = str(t.mode).lower()
    if mode not in MODES:
        raise RuntimeError("Unsupported ReadTarget mode")
    return mode, None if t.parallelism is None else parse(t.parallelism)


def shard_of(tensor: Any, axes: tuple[AxisSpec, ...]) -> tuple[Any, M.Shard]:
    """What the wheel stores for a write with these axes: a single tp axis takes ``tensor`` as
    that rank's shard (the whole is ``size`` of them); several axes with a tp one take the whole
    tensor and keep the rank's equal share; axes without tp keep the tensor as it is."""
    shape = [int(d) for d in tensor.shape]
    stored = tuple(a.stored() for a in axes)
    tp = next((a for a in axes if a.kind == "tp"), None)
    if tp is None:
        return tensor, M.Shard(tuple(shape), stored)
    sd = tp.split_dim if tp.split_dim is not None else -1
    if not 0 <= sd < len(shape):
        raise E.InvalidParams(f"split_dim {tp.split_dim} outside a {len(shape)}-d tensor")
    if len(axes) == 1:
        whole = shape.copy()
        whole[sd] *= tp.size
        return tensor, M.Shard(tuple(whole), stored)
    if shape[sd] % tp.size:
        raise E.InvalidParams(f"dimension {sd} of size {shape[sd]} is not {tp.size} equal shards")
    ext = shape[sd] // tp.size
    return tensor.narrow(sd, tp.rank * ext, ext).contiguous(), M.Shard(tuple(shape), stored)
