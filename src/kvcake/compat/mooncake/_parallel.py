"""Tensor-parallel tensor methods: the ``_with_tp`` family (split on put, one shard per key
``{key}_tp_{rank}``) and the ``_with_parallelism`` family (``TensorParallelism`` /
``ReadTarget``). kvcake implements the tensor-parallel axis (``kind`` "" or "tp"); other axis
kinds and ``writer_partition`` requests are refused with -600."""

from __future__ import annotations

from typing import Any

from kvcake.compat.mooncake import _tensor_meta as M
from kvcake.compat.mooncake._base import StoreBase, check_key, returns, view
from kvcake.compat.mooncake._tensors import TensorMethods, tp_key
from kvcake.compat.mooncake._types import ReplicateConfig
from kvcake.store import errors as E


class ParallelAxis:
    def __init__(self) -> None:
        self.kind = ""
        self.rank = 0
        self.size = 1
        self.split_dim: int | None = None
        self.expert_id: int | None = None
        self.stage_id: int | None = None


class TensorParallelism:
    def __init__(self) -> None:
        self.axes: list[ParallelAxis] = []


class ReadTarget:
    def __init__(self) -> None:
        self.mode = "as_stored"
        self.parallelism: TensorParallelism | None = None


def _tp_axis(par: TensorParallelism | None) -> ParallelAxis | None:
    if par is None or not par.axes:
        return None
    if len(par.axes) != 1 or par.axes[0].kind not in ("", "tp"):
        raise E.InvalidParams("kvcake supports one tensor-parallel ('tp') axis")
    ax = par.axes[0]
    if not 0 <= ax.rank < ax.size:
        raise E.InvalidParams(f"axis rank {ax.rank} outside size {ax.size}")
    return ax


class ParallelMethods(TensorMethods, StoreBase):
    # --- _with_tp -----------------------------------------------------------------------------

    def _batch_put_tp(
        self, keys: list[str], tensors: list[Any], config: Any, tp_size: int, split_dim: int
    ) -> list[int]:
        if len(keys) != len(tensors):
            return [E.INVALID_PARAMS] * len(keys)
        return [
            self._put_tp(k, t, config, tp_size, split_dim, False)
            for k, t in zip(keys, tensors, strict=True)
        ]

    def _put_tp(
        self, key: str, tensor: Any, config: Any, tp_size: int, split_dim: int, up: bool
    ) -> int:
        check_key(key)
        if not key or tp_size < 1:
            return E.INVALID_PARAMS
        try:
            shards = M.split(tensor, tp_size, split_dim)
        except (M.TensorFormatError, AttributeError):
            return E.INVALID_PARAMS
        if tp_size == 1:  # the wheel stores an unsplit tensor under the key itself
            return self._put(key, memoryview(M.encode(tensor)), config, upsert=up)
        keys = [tp_key(key, s.rank) for _, s in shards]
        blobs = [memoryview(M.encode(t, s)) for t, s in shards]
        return next((c for c in self._put_batch(keys, blobs, config, upsert=up) if c), 0)

    @returns(int)
    def put_tensor_with_tp(
        self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> int:
        return self._put_tp(key, tensor, None, tp_size, split_dim, False)

    @returns(int)
    def pub_tensor_with_tp(
        self,
        key: str,
        tensor: Any,
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        return self._put_tp(key, tensor, config, tp_size, split_dim, False)

    @returns([])
    def batch_put_tensor_with_tp(
        self,
        base_keys: list[str],
        tensors_list: list[Any],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        return self._batch_put_tp(base_keys, tensors_list, None, tp_size, split_dim)

    @returns([])
    def batch_pub_tensor_with_tp(
        self,
        base_keys: list[str],
        tensors_list: list[Any],
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        return self._batch_put_tp(base_keys, tensors_list, config, tp_size, split_dim)

    @returns(int)
    def put_tensor_with_tp_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        try:
            tensor = M.decode(view(buffer_ptr, size))
        except M.TensorFormatError:
            return E.INVALID_PARAMS
        return self._put_tp(key, tensor, None, tp_size, split_dim, False)

    @returns([])
    def batch_put_tensor_with_tp_from(
        self,
        base_keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        if not len(base_keys) == len(buffer_ptrs) == len(sizes):
            return [E.INVALID_PARAMS] * len(base_keys)
        return [
            self.put_tensor_with_tp_from(k, p, s, tp_rank, tp_size, split_dim)
            for k, p, s in zip(base_keys, buffer_ptrs, sizes, strict=True)
        ]

    @returns(None)
    def get_tensor_with_tp(
        self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> Any:
        check_key(key)
        return self.get_tensor(tp_key(key, tp_rank)) if key else None

    @returns([])
    def batch_get_tensor_with_tp(
        self, base_keys: list[str], tp_rank: int = 0, tp_size: int = 1
    ) -> list[Any]:
        return self.batch_get_tensor([tp_key(k, tp_rank) for k in base_keys])

    @returns(None)
    def get_tensor_with_tp_into(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> Any:
        return self.get_tensor_into(tp_key(key, tp_rank), buffer_ptr, size)

    @returns([])
    def batch_get_tensor_with_tp_into(
        self,
        base_keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> list[Any]:
        keys = [tp_key(k, tp_rank) for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    # --- _with_parallelism --------------------------------------------------------------------

    def _put_par(
        self, key: str, tensor: Any, par: Any, config: Any, writer_partition: Any, up: bool
    ) -> int:
        check_key(key)
        if writer_partition is not None:
            return E.INVALID_PARAMS
        ax = _tp_axis(par)
        if ax is None:
            return self._put(key, memoryview(M.encode(tensor)), config, upsert=up)
        dim = ax.split_dim or 0
        shape = list(tensor.shape)
        offset = ax.rank * shape[dim]
        shape[dim] *= ax.size
        shard = M.Shard(ax.rank, ax.size, dim, offset, tuple(shape))
        return self._put(tp_key(key, ax.rank), memoryview(M.encode(tensor, shard)), config, up)

    @returns(int)
    def put_tensor_with_parallelism(
        self,
        key: str,
        tensor: Any,
        parallelism: TensorParallelism | None = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        return self._put_par(key, tensor, parallelism, config, writer_partition, False)

    @returns(int)
    def upsert_tensor_with_parallelism(
        self,
        key: str,
        tensor: Any,
        parallelism: TensorParallelism | None = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        return self._put_par(key, tensor, parallelism, config, writer_partition, True)

    def _batch_par(
        self, keys: list[str], tensors: list[Any], pars: Any, config: Any, wp: Any, up: bool
    ) -> list[int]:
        if len(keys) != len(tensors) or (pars is not None and len(pars) != len(keys)):
            return [E.INVALID_PARAMS] * len(keys)
        pars = pars if pars is not None else [None] * len(keys)
        return [
            self._put_par(k, t, p, config, wp, up)
            for k, t, p in zip(keys, tensors, pars, strict=True)
        ]

    @returns([])
    def batch_put_tensor_with_parallelism(
        self,
        keys: list[str],
        tensors_list: list[Any],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        return self._batch_par(keys, tensors_list, parallelisms, config, writer_partitions, False)

    @returns([])
    def batch_upsert_tensor_with_parallelism(
        self,
        keys: list[str],
        tensors_list: list[Any],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        return self._batch_par(keys, tensors_list, parallelisms, config, writer_partitions, True)

    def _from_par(
        self, key: str, ptr: int, size: int, par: Any, config: Any, wp: Any, up: bool
    ) -> int:
        try:
            tensor = M.decode(view(ptr, size))
        except M.TensorFormatError:
            return E.INVALID_PARAMS
        return self._put_par(key, tensor, par, config, wp, up)

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

    def _batch_from_par(
        self,
        keys: list[str],
        ptrs: list[int],
        sizes: list[int],
        pars: Any,
        config: Any,
        wp: Any,
        up: bool,
    ) -> list[int]:
        if not len(keys) == len(ptrs) == len(sizes) or (
            pars is not None and len(pars) != len(keys)
        ):
            return [E.INVALID_PARAMS] * len(keys)
        pars = pars if pars is not None else [None] * len(keys)
        return [
            self._from_par(k, p, s, par, config, wp, up)
            for k, p, s, par in zip(keys, ptrs, sizes, pars, strict=True)
        ]

    @returns([])
    def batch_put_tensor_with_parallelism_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int], parallelisms: Any = None,
        config: ReplicateConfig | None = None, writer_partitions: Any = None,
    ) -> list[int]:  # fmt: skip
        return self._batch_from_par(
            keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, False
        )

    @returns([])
    def batch_upsert_tensor_with_parallelism_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int], parallelisms: Any = None,
        config: ReplicateConfig | None = None, writer_partitions: Any = None,
    ) -> list[int]:  # fmt: skip
        return self._batch_from_par(
            keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, True
        )

    def _target_key(self, key: str, target: ReadTarget | None) -> str:
        check_key(key)
        if target is None or target.parallelism is None:
            return key
        if target.mode != "as_stored":
            raise E.InvalidParams(f"ReadTarget.mode {target.mode!r}: kvcake reads 'as_stored'")
        ax = _tp_axis(target.parallelism)
        return key if ax is None else tp_key(key, ax.rank)

    @returns(None)
    def get_tensor_with_parallelism(self, key: str, target: ReadTarget | None = None) -> Any:
        return self.get_tensor(self._target_key(key, target))

    @returns(None)
    def get_tensor_with_parallelism_into(
        self, key: str, buffer_ptr: int, size: int, target: ReadTarget | None = None
    ) -> Any:
        return self.get_tensor_into(self._target_key(key, target), buffer_ptr, size)

    @returns([])
    def batch_get_tensor_with_parallelism(self, keys: list[str], targets: Any = None) -> list[Any]:
        ts = targets if targets is not None else [None] * len(keys)
        return self.batch_get_tensor(
            [self._target_key(k, t) for k, t in zip(keys, ts, strict=True)]
        )

    @returns([])
    def batch_get_tensor_with_parallelism_into(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int], targets: Any = None
    ) -> list[Any]:
        ts = targets if targets is not None else [None] * len(keys)
        ks = [self._target_key(k, t) for k, t in zip(keys, ts, strict=True)]
        return self.batch_get_tensor_into(ks, buffer_ptrs, sizes)
