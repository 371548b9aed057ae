"""The shim's torch tensor helpers. A stored tensor is a small header (dtype and shape, msgpack)
followed by its raw bytes, so any dtype (bfloat16 included) round-trips exactly."""

from __future__ import annotations

import struct
from typing import Any

import msgspec

from kvcake.compat._base import StoreBase, _returns
from kvcake.core.errors import StoreError
from kvcake.store import errors as E

MAGIC = b"KVT1"
HEAD = struct.Struct("<4sI")


def encode_tensor(tensor: Any) -> bytes:
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise E.InvalidParams(f"expected a torch.Tensor, got {type(tensor).__name__}")
    t = tensor.detach().cpu().contiguous()
    meta = msgspec.msgpack.encode(
        {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
    )
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return HEAD.pack(MAGIC, len(meta)) + meta + raw


def decode_tensor(blob: bytes | bytearray) -> Any:
    import torch

    magic, n = HEAD.unpack_from(blob)
    if magic != MAGIC:
        raise E.InvalidParams("value is not a stored tensor")
    meta = msgspec.msgpack.decode(blob[HEAD.size : HEAD.size + n])
    dtype = getattr(torch, meta["dtype"])
    raw = bytearray(blob[HEAD.size + n :])
    flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(meta["shape"])


class TensorMethods(StoreBase):
    @_returns(int)
    def put_tensor(self, key: str, tensor: Any) -> int:
        return self._put(key, memoryview(encode_tensor(tensor)), None, upsert=False)

    @_returns(None)
    def get_tensor(self, key: str) -> Any:
        got = self.client.batch_get([key])[0] if key else None
        return None if got is None or isinstance(got, StoreError) else decode_tensor(got)

    @_returns([])
    def batch_put_tensor(self, keys: list[str], tensors: list[Any]) -> list[int]:
        if len(keys) != len(tensors):
            return [E.INVALID_PARAMS] * len(keys)
        views = [memoryview(encode_tensor(t)) for t in tensors]
        return self._put_batch(keys, views, None, upsert=False)

    @_returns([])
    def batch_get_tensor(self, keys: list[str]) -> list[Any]:
        return [
            None if isinstance(g, StoreError) else decode_tensor(g)
            for g in self.client.batch_get(keys)
        ]
