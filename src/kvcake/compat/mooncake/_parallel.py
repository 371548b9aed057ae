"""Tensor-parallel tensor methods, the ``_with_tp`` family: split on put (equal shards, as the
wheel requires), one shard per key ``{key}_tp_{rank}``, each read back by its rank. The
``_with_parallelism`` family is in :mod:`._parallelism`."""

from __future__ import annotations

from typing import Any

from kvcake.compat.mooncake import _tensor_meta as M
from kvcake.compat.mooncake._base import Conn, check_key, returns, view
from kvcake.compat.mooncake._tensors import Tensors, tp_key
from kvcake.compat.mooncake._types import ReplicateConfig
from kvcake.store import errors as E


class TpTensors:
    """The ``_with_tp`` family: writes through the Conn, reads through the whole-tensor calls
    (a shard is a whole tensor under its own key)."""

    def __init__(self, conn: Conn, tensors: Tensors) -> None:
        self._conn = conn
        self._tensors = tensors

    def _batch_put_tp(
        self, keys: list[str], tensors: list[Any], config: Any, tp_size: int, split_dim: int
    ) -> list[int]:
        if len(keys) != len(tensors):
            return [E.INVALID_PARAMS] * len(keys)
        return [
            self.put_tp(k, t, config, tp_size, split_dim, False)
            for k, t in zip(keys, tensors, strict=True)
        ]

    def put_tp(
        self, key: str, tensor: Any, config: Any, tp_size: int, split_dim: int, up: bool
    ) -> int:
        """Every rank's shard of ``tensor`` under its own key (the key itself for tp_size 1)."""
        check_key(key)
        if not key or tp_size < 1:
            return E.INVALID_PARAMS
        try:
            shards = M.split(tensor, tp_size, split_dim)
        except (M.TensorFormatError, AttributeError):
            return E.INVALID_PARAMS
        if tp_size == 1:  # the wheel stores an unsplit tensor under the key itself
            return self._conn.put(key, memoryview(M.encode(tensor)), config, upsert=up)
        keys = [tp_key(key, s.axes[0].rank) for _, s in shards]
        blobs = [memoryview(M.encode(t, s)) for t, s in shards]
        return next((c for c in self._conn.put_batch(keys, blobs, config, upsert=up) if c), 0)

    @returns(int)
    def put_tensor_with_tp(
        self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> int:
        return self.put_tp(key, tensor, None, tp_size, split_dim, False)

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
        return self.put_tp(key, tensor, config, tp_size, split_dim, False)

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
        return self.put_tp(key, tensor, None, tp_size, split_dim, False)

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
        return self._tensors.get_tensor(_read_key(key, tp_rank, tp_size)) if key else None

    @returns([])
    def batch_get_tensor_with_tp(
        self, base_keys: list[str], tp_rank: int = 0, tp_size: int = 1
    ) -> list[Any]:
        return self._tensors.batch_get_tensor([_read_key(k, tp_rank, tp_size) for k in base_keys])

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
        return self._tensors.get_tensor_into(_read_key(key, tp_rank, tp_size), buffer_ptr, size)

    @returns([])
    def batch_get_tensor_with_tp_into(
        self,
        base_keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> list[Any]:
        keys = [_read_key(k, tp_rank, tp_size) for k in base_keys]
        return self._tensors.batch_get_tensor_into(keys, buffer_ptrs, sizes)


def _read_key(key: str, rank: int, size: int) -> str:
    """tp_size 1 reads the key itself (what ``put_tensor_with_tp`` stores for it), as the wheel."""
    return key if size <= 1 else tp_key(key, rank)
