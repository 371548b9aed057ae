"""The ``_with_parallelism`` family: writes name each stored object by its axes
(:mod:`._par_types`), reads follow the ``ReadTarget``'s mode as the wheel's do:

- ``as_stored`` (or no target): the object under the key itself; with a parallelism: None.
- ``shard`` + a single tp axis (rank r of n, split d): the stored shard ``{key}_tp_{r}`` when its
  header says exactly that; otherwise the whole tensor is rebuilt from the stored tp shards and
  cut into n equal shares along d (None when it does not divide); failing that the stored shard
  ``{key}_tp_{r}`` as it is (not in the ``_into`` forms). Other axes: the exact object or None.
- ``full`` + a single tp axis: the whole tensor rebuilt from every stored shard (the request's
  rank and size do not matter, its split dim must be the stored one); without a parallelism
  the object under the key itself; other axes: None.

``writer_partition`` writes and reads: :mod:`._writer`."""

from __future__ import annotations

from typing import Any

from kvcake.compat.mooncake import _par_types as T
from kvcake.compat.mooncake import _tensor_meta as M
from kvcake.compat.mooncake import _writer as W
from kvcake.compat.mooncake._base import Conn, check_key, returns, view
from kvcake.compat.mooncake._parallel import TpTensors
from kvcake.compat.mooncake._tensors import Tensors, tp_key
from kvcake.compat.mooncake._types import ReplicateConfig
from kvcake.core.errors import KvcakeError, StoreError
from kvcake.store import errors as E

Into = tuple[int, int] | None  # (buffer_ptr, size) of an _into read


class ParTensors:
    """The ``_with_parallelism`` family: writes and plain reads through the Conn; a single tp
    axis written from a buffer goes through the ``_with_tp`` writer. Tensors returned are fresh
    except the ``_into`` forms', which view the caller's buffer."""

    def __init__(self, conn: Conn, tensors: Tensors, tp: TpTensors) -> None:
        self._conn = conn
        self._tensors = tensors
        self._tp = tp

    # --- writes -------------------------------------------------------------------------------

    def _put_par(self, key: str, tensor: Any, par: Any, config: Any, wp: Any, up: bool) -> int:
        check_key(key)
        if wp is not None:  # a writer's share of the whole, plus the manifest
            if par is not None:
                return E.INVALID_PARAMS
            codes = [
                self._conn.put(k, memoryview(b), config, up) for k, b in W.plan(key, tensor, wp)
            ]
            return next((c for c in codes if c), 0)
        if par is None:
            return self._conn.put(key, memoryview(M.encode(tensor)), config, upsert=up)
        axes = T.parse(par)
        local, shard = T.shard_of(tensor, axes)
        return self._conn.put(
            T.object_key(key, axes), memoryview(M.encode(local, shard)), config, up
        )

    def _from_par(
        self, key: str, ptr: int, size: int, par: Any, cfg: Any, wp: Any, up: bool
    ) -> int:
        """The buffer holds a whole stored tensor; a single tp axis stores every rank's share
        (as ``put_tensor_with_tp_from``), other axes as the tensor writes do."""
        try:
            tensor = M.decode(view(ptr, size))
        except M.TensorFormatError:
            return E.INVALID_PARAMS
        if par is not None and wp is None:
            tp = T.single_tp(T.parse(par))
            if tp is not None:
                return self._tp.put_tp(key, tensor, cfg, tp.size, tp.split_dim or 0, up)
        return self._put_par(key, tensor, par, cfg, wp, up)

    def _par_each(self, fn: Any, n: int, pars: Any, wps: Any, *columns: list[Any]) -> list[int]:
        """One call per item; a list whose length differs from the keys' fails every item."""
        if any(len(c) != n for c in columns) or any(
            x is not None and len(x) != n for x in (pars, wps)
        ):
            return [E.INVALID_PARAMS] * n
        pars, wps = pars or [None] * n, wps or [None] * n
        return [_code(fn, *row) for row in zip(*columns, pars, wps, strict=True)]

    @returns(int)
    def put_tensor_with_parallelism(
        self, key: str, tensor: Any, parallelism: Any = None,
        config: ReplicateConfig | None = None, writer_partition: Any = None,
    ) -> int:  # fmt: skip
        return self._put_par(key, tensor, parallelism, config, writer_partition, False)

    @returns(int)
    def upsert_tensor_with_parallelism(
        self, key: str, tensor: Any, parallelism: Any = None,
        config: ReplicateConfig | None = None, writer_partition: Any = None,
    ) -> int:  # fmt: skip
        return self._put_par(key, tensor, parallelism, config, writer_partition, True)

    @returns([])
    def batch_put_tensor_with_parallelism(
        self, keys: list[str], tensors_list: list[Any], parallelisms: Any = None,
        config: ReplicateConfig | None = None, writer_partitions: Any = None,
    ) -> list[int]:  # fmt: skip
        def one(k: str, t: Any, p: Any, w: Any) -> int:
            return self._put_par(k, t, p, config, w, False)

        return self._par_each(one, len(keys), parallelisms, writer_partitions, keys, tensors_list)

    @returns([])
    def batch_upsert_tensor_with_parallelism(
        self, keys: list[str], tensors_list: list[Any], parallelisms: Any = None,
        config: ReplicateConfig | None = None, writer_partitions: Any = None,
    ) -> list[int]:  # fmt: skip
        def one(k: str, t: Any, p: Any, w: Any) -> int:
            return self._put_par(k, t, p, config, w, True)

        return self._par_each(one, len(keys), parallelisms, writer_partitions, keys, tensors_list)

    @returns(int)
    def put_tensor_with_parallelism_from(
        self, key: str, buffer_ptr: int, size: int, parallelism: Any = None,
        config: ReplicateConfig | None = None, writer_partition: Any = None,
    ) -> int:  # fmt: skip
        return self._from_par(key, buffer_ptr, size, parallelism, config, writer_partition, False)

    @returns(int)
    def upsert_tensor_with_parallelism_from(
        self, key: str, buffer_ptr: int, size: int, parallelism: Any = None,
        config: ReplicateConfig | None = None, writer_partition: Any = None,
    ) -> int:  # fmt: skip
        return self._from_par(key, buffer_ptr, size, parallelism, config, writer_partition, True)

    @returns([])
    def batch_put_tensor_with_parallelism_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int], parallelisms: Any = None,
        config: ReplicateConfig | None = None, writer_partitions: Any = None,
    ) -> list[int]:  # fmt: skip
        def one(k: str, b: int, s: int, p: Any, w: Any) -> int:
            return self._from_par(k, b, s, p, config, w, False)

        n = len(keys)
        return self._par_each(one, n, parallelisms, writer_partitions, keys, buffer_ptrs, sizes)

    @returns([])
    def batch_upsert_tensor_with_parallelism_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int], parallelisms: Any = None,
        config: ReplicateConfig | None = None, writer_partitions: Any = None,
    ) -> list[int]:  # fmt: skip
        def one(k: str, b: int, s: int, p: Any, w: Any) -> int:
            return self._from_par(k, b, s, p, config, w, True)

        n = len(keys)
        return self._par_each(one, n, parallelisms, writer_partitions, keys, buffer_ptrs, sizes)

    # --- reads --------------------------------------------------------------------------------

    def _par_read(self, key: str, target: Any, into: Into) -> Any:
        check_key(key)
        mode, axes = T.target(target)
        if axes is None:
            if mode == "shard":
                return None
            raw = self._tensors.get_raw(key)
            if raw is None and mode == "full":
                whole = W.rebuild(key, self._tensors.get_raw(W.manifest_key(key)), self._raw_many)
                return None if whole is None else self._par_out(whole, None, into)
            return self._par_raw_out(raw, into)
        tp = T.single_tp(axes)
        if mode == "as_stored" or (mode == "full" and tp is None):
            return None
        if tp is None:  # shard of other axes: the exact stored object
            raw = self._tensors.get_raw(T.object_key(key, axes))
            stored = None if raw is None else _shard(raw)
            want = T.canonical(tuple(a.stored() for a in axes))
            ok = stored is not None and T.canonical(stored) == want
            return self._par_raw_out(raw if ok else None, into)
        sd = tp.split_dim or 0
        if mode == "full":
            whole = self._tp_rebuild(key, sd)
            return None if whole is None else self._par_out(whole, None, into)
        raw = self._tensors.get_raw(tp_key(key, tp.rank))
        if raw is not None and _shard(raw) == (tp.stored(),):
            return self._par_raw_out(raw, into)
        if raw is None:  # a writer's share of this rank
            writer = self._tensors.get_raw(W.shard_key(key, tp.rank, tp.size, sd))
            if writer is not None and _shard(writer) == (tp.stored(),):
                return self._par_raw_out(writer, into)
        whole = self._tp_rebuild(key, sd)
        if whole is not None and whole.shape[sd] % tp.size == 0:
            ext = whole.shape[sd] // tp.size
            piece = whole.narrow(sd, tp.rank * ext, ext).contiguous()
            shard = M.Shard(tuple(int(d) for d in whole.shape), (tp.stored(),))
            return self._par_out(piece, shard, into)
        return M.decode(raw) if raw is not None and into is None else None

    def _tp_rebuild(self, key: str, split_dim: int) -> Any:
        """The whole tensor from its stored tp shards, or None if any is missing or disagrees."""
        # lazy: optional dependency (torch)
        import torch

        first = self._tensors.get_raw(tp_key(key, 0))
        head = None if first is None else M.parse(first)[3]
        ax = None if head is None else head.axis(M.AXIS_TP)
        if ax is None or head is None or ax.split_dim != split_dim or len(head.axes) != 1:
            return None
        keys = [tp_key(key, r) for r in range(ax.size)]
        blobs = [first, *(self._conn.c.batch_get(keys[1:]) if ax.size > 1 else [])]
        parts = []
        for rank, blob in enumerate(blobs):
            s = None if isinstance(blob, StoreError) else M.parse(blob)[3]
            if (
                s is None
                or s.global_shape != head.global_shape
                or s.axes != (M.Axis(M.AXIS_TP, rank, ax.size, split_dim),)
            ):
                return None
            parts.append(M.decode(blob))
        whole = torch.cat(parts, dim=split_dim)
        return whole if tuple(whole.shape) == head.global_shape else None

    def _raw_many(self, keys: list[str]) -> list[Any]:
        return [None if isinstance(b, StoreError) else b for b in self._conn.c.batch_get(keys)]

    def _par_raw_out(self, raw: bytearray | None, into: Into) -> Any:
        if raw is None:
            return None
        if into is None:
            return M.decode(raw)
        dst = view(*into)
        if len(raw) > dst.nbytes:
            return None
        dst[: len(raw)] = raw
        return M.decode(dst[: len(raw)], copy=False)

    def _par_out(self, tensor: Any, shard: M.Shard | None, into: Into) -> Any:
        return (
            tensor if into is None else self._par_raw_out(bytearray(M.encode(tensor, shard)), into)
        )

    def _par_read_each(self, keys: list[str], targets: Any, intos: list[Into]) -> list[Any]:
        if targets is None:
            targets = [None] * len(keys)
        if len(targets) != len(keys):
            return [None] * len(keys)
        for t in targets:  # an unknown mode anywhere raises, as the wheel does
            if t is not None and hasattr(t, "mode") and str(t.mode).lower() not in T.MODES:
                raise RuntimeError("Unsupported ReadTarget mode")
        return [
            _value(self._par_read, k, t, i) for k, t, i in zip(keys, targets, intos, strict=True)
        ]

    @returns(None)
    def get_tensor_with_parallelism(self, key: str, target: Any = None) -> Any:
        return self._par_read(key, target, None)

    @returns(None)
    def get_tensor_with_parallelism_into(
        self, key: str, buffer_ptr: int, size: int, target: Any = None
    ) -> Any:
        return self._par_read(key, target, (buffer_ptr, size))

    @returns([])
    def batch_get_tensor_with_parallelism(self, keys: list[str], targets: Any = None) -> list[Any]:
        return self._par_read_each(keys, targets, [None] * len(keys))

    @returns([])
    def batch_get_tensor_with_parallelism_into(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int], targets: Any = None
    ) -> list[Any]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [None] * len(keys)
        intos: list[Into] = list(zip(buffer_ptrs, sizes, strict=True))
        return self._par_read_each(keys, targets, intos)


def _shard(raw: Any) -> tuple[M.Axis, ...] | None:
    try:
        s = M.parse(raw)[3]
    except M.TensorFormatError:
        return None
    return None if s is None else s.axes


def _code(fn: Any, *args: Any) -> int:
    try:
        return int(fn(*args))
    except StoreError as exc:
        return exc.code
    except (KvcakeError, ValueError, OverflowError, TypeError, AttributeError):
        return E.INVALID_PARAMS


def _value(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except (KvcakeError, ValueError, OverflowError, TypeError, AttributeError):
        return None
