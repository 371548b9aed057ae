"""The shim's zero-copy calls on integer addresses (``register_buffer``, ``put_from``,
``get_into`` and their batch / multi-buffer forms), Mooncake-style return codes."""

from __future__ import annotations

from kvcake.compat._base import ReplicateConfig, StoreBase, _returns, _view
from kvcake.core.errors import StoreError
from kvcake.store import errors as E


class PointerMethods(StoreBase):
    @_returns(int)
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        _view(buffer_ptr, size)  # validates
        self._registered[buffer_ptr] = size
        return 0

    @_returns(int)
    def unregister_buffer(self, buffer_ptr: int) -> int:
        if self._registered.pop(buffer_ptr, None) is None:
            return E.INVALID_PARAMS
        return 0

    @_returns(int)
    def put_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        return self._put(key, _view(buffer_ptr, size), config, upsert=False)

    @_returns(int)
    def upsert_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        return self._put(key, _view(buffer_ptr, size), config, upsert=True)

    @_returns(int)
    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        if not key:
            return E.INVALID_PARAMS
        return self.client.get_into(key, _view(buffer_ptr, size))

    @_returns([])
    def batch_put_from(
        self,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        if not (len(keys) == len(buffer_ptrs) == len(sizes)):
            return [E.INVALID_PARAMS] * len(keys)
        views = [_view(p, s) for p, s in zip(buffer_ptrs, sizes, strict=True)]
        return self._put_batch(keys, views, config, upsert=False)

    @_returns([])
    def batch_get_into(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]:
        if not (len(keys) == len(buffer_ptrs) == len(sizes)):
            return [E.INVALID_PARAMS] * len(keys)
        views = [_view(p, s) for p, s in zip(buffer_ptrs, sizes, strict=True)]
        got = self.client.batch_get_into(keys, views)
        return [g.code if isinstance(g, StoreError) else g for g in got]

    @_returns([])
    def batch_put_from_multi_buffers(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Each object is the concatenation of its buffers (gathered into one value)."""
        if not (len(keys) == len(all_buffer_ptrs) == len(all_sizes)):
            return [E.INVALID_PARAMS] * len(keys)
        values = []
        for ptrs, sizes in zip(all_buffer_ptrs, all_sizes, strict=True):
            if len(ptrs) != len(sizes):
                return [E.INVALID_PARAMS] * len(keys)
            values.append(
                memoryview(b"".join(_view(p, s) for p, s in zip(ptrs, sizes, strict=True)))
            )
        return self._put_batch(keys, values, config, upsert=False)

    @_returns([])
    def batch_get_into_multi_buffers(
        self, keys: list[str], all_buffer_ptrs: list[list[int]], all_sizes: list[list[int]]
    ) -> list[int]:
        """Scatter each object over its buffers in order; -600 if they are too small."""
        if not (len(keys) == len(all_buffer_ptrs) == len(all_sizes)):
            return [E.INVALID_PARAMS] * len(keys)
        out = []
        for key, got in zip(keys, self.client.batch_get(keys), strict=True):
            if isinstance(got, StoreError):
                out.append(got.code)
                continue
            i = keys.index(key)
            ptrs, sizes = all_buffer_ptrs[i], all_sizes[i]
            if len(ptrs) != len(sizes) or sum(sizes) < len(got):
                out.append(E.INVALID_PARAMS)
                continue
            pos = 0
            for p, s in zip(ptrs, sizes, strict=True):
                n = min(s, len(got) - pos)
                if n > 0:
                    _view(p, s)[:n] = got[pos : pos + n]
                pos += n
            out.append(len(got))
        return out
