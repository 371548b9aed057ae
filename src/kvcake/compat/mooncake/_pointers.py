"""Zero-copy calls on integer addresses: ``register_buffer``, ``put_from`` / ``get_into`` and their
batch, upsert, multi-buffer and range forms. Addresses are viewed through ctypes; the caller
guarantees they stay valid for the call (as with Mooncake)."""

from __future__ import annotations

from typing import Any

from kvcake.compat.mooncake._base import Conn, check_key, returns, view
from kvcake.compat.mooncake._types import ReplicateConfig
from kvcake.core.errors import StoreError
from kvcake.store import errors as E


def _lists_match(*lists: list) -> bool:
    return all(isinstance(x, list) for x in lists) and len({len(x) for x in lists}) == 1


class PointerOps:
    """Zero-copy calls on caller addresses. Holds the Conn and the table of registered buffers
    (address -> size; shared with the store, which clears it on close). The caller owns the
    memory and keeps it valid for each call; the table only records what was registered."""

    def __init__(self, conn: Conn, registered: dict[int, int]) -> None:
        self._conn = conn
        self._registered = registered

    @returns(int)
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        view(buffer_ptr, size)  # validates
        self._registered[buffer_ptr] = size
        return 0

    @returns(int)
    def unregister_buffer(self, buffer_ptr: int) -> int:
        return 0 if self._registered.pop(buffer_ptr, None) is not None else E.INVALID_PARAMS

    def _registered_view(self, ptr: int) -> memoryview | None:
        size = self._registered.get(ptr)
        return None if size is None else view(ptr, size)

    # --- single -------------------------------------------------------------------------------

    def _put_ptr(
        self, key: str, ptr: int, size: int, config: ReplicateConfig | None, up: bool
    ) -> int:
        check_key(key)
        if size == 0 and key:
            return 0  # the wheel reports success for an empty put_from and stores nothing
        return self._conn.put(key, view(ptr, size), config, upsert=up)

    @returns(int)
    def put_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        return self._put_ptr(key, buffer_ptr, size, config, False)

    @returns(int)
    def upsert_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        return self._put_ptr(key, buffer_ptr, size, config, True)

    @returns(int)
    def put_from_with_metadata(
        self,
        key: str,
        buffer_ptr: int,
        metadata_buffer_ptr: int,
        size: int,
        metadata_size: int,
        config: ReplicateConfig | None = None,
    ) -> int:
        """The object is the metadata bytes followed by the data bytes."""
        check_key(key)
        joined = bytes(view(metadata_buffer_ptr, metadata_size)) + bytes(view(buffer_ptr, size))
        return self._conn.put(key, memoryview(joined), config, upsert=False)

    @returns(int)
    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        check_key(key)
        if not key:
            return E.INVALID_PARAMS
        return self._conn.c.get_into(key, view(buffer_ptr, size))

    # --- batches ------------------------------------------------------------------------------

    def _batch_ptr(
        self,
        keys: list[str],
        ptrs: list[int],
        sizes: list[int],
        config: ReplicateConfig | None,
        up: bool,
    ) -> list[int]:
        if not _lists_match(keys, ptrs, sizes):
            return [E.INVALID_PARAMS] * len(keys)
        views = [view(p, s) for p, s in zip(ptrs, sizes, strict=True)]
        return self._conn.put_batch(keys, views, config, upsert=up)

    @returns([])
    def batch_put_from(
        self,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        return self._batch_ptr(keys, buffer_ptrs, sizes, config, False)

    @returns([])
    def batch_upsert_from(
        self,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        return self._batch_ptr(keys, buffer_ptrs, sizes, config, True)

    @returns([])
    def batch_get_into(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]:
        if not _lists_match(keys, buffer_ptrs, sizes):
            return [E.INVALID_PARAMS] * len(keys)
        if not keys:
            return []
        views = [view(p, s) for p, s in zip(buffer_ptrs, sizes, strict=True)]
        got = self._conn.c.batch_get_into(keys, views)
        return [g.code if isinstance(g, StoreError) else g for g in got]

    @returns([])
    def batch_put_from_multi_buffers(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Each object is the concatenation of its buffers."""
        if not _lists_match(keys, all_buffer_ptrs, all_sizes) or any(
            len(p) != len(s) for p, s in zip(all_buffer_ptrs, all_sizes, strict=True)
        ):
            return [E.INVALID_PARAMS] * len(keys)
        values = [
            memoryview(b"".join(view(p, s) for p, s in zip(ptrs, sizes, strict=True)))
            for ptrs, sizes in zip(all_buffer_ptrs, all_sizes, strict=True)
        ]
        return self._conn.put_batch(keys, values, config, upsert=False)

    @returns([])
    def batch_get_into_multi_buffers(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> list[int]:
        """Scatter each object over its buffers in order; -600 if they cannot hold it."""
        if not _lists_match(keys, all_buffer_ptrs, all_sizes):
            return [E.INVALID_PARAMS] * len(keys)
        out = []
        for i, got in enumerate(self._conn.c.batch_get(keys) if keys else []):
            ptrs, sizes = all_buffer_ptrs[i], all_sizes[i]
            if isinstance(got, StoreError):
                out.append(got.code)
            elif len(ptrs) != len(sizes) or sum(sizes) < len(got):
                out.append(E.INVALID_PARAMS)
            else:
                pos = 0
                for p, s in zip(ptrs, sizes, strict=True):
                    n = min(s, len(got) - pos)
                    if n > 0:
                        view(p, n)[:] = got[pos : pos + n]
                    pos += n
                out.append(len(got))
        return out

    # --- ranges -------------------------------------------------------------------------------

    @returns([])
    def get_into_ranges(
        self,
        buffer_ptrs: list[int],
        all_keys: list[list[str]],
        all_dst_offsets: list[list[list[int]]],
        all_src_offsets: list[list[list[int]]],
        all_sizes: list[list[list[int]]],
    ) -> list[list[list[int]]]:
        """Per buffer, per key, per range: bytes copied or an error code. Buffers must be
        registered (their size bounds the ranges), as with the wheel (-600 otherwise).
        Mismatched list lengths fail as the wheel's do: every range of every buffer when the
        outer lists differ, every key of a buffer whose inner lists differ, every range of a
        key whose offset and size lists differ (one -600 per destination offset)."""
        lists = (all_keys, all_dst_offsets, all_src_offsets, all_sizes)
        if not (_nested(buffer_ptrs, int, 1) and _nested(all_keys, str, 2)) or not all(
            _nested(x, int, 3) for x in lists[1:]
        ):  # pybind11's conversion of the arguments
            raise TypeError("get_into_ranges(): incompatible function arguments")
        if not _lists_match(buffer_ptrs, *lists):
            return [_failed(lists, b) for b in range(len(buffer_ptrs))]
        ok = [_lists_match(*(x[b] for x in lists)) for b in range(len(buffer_ptrs))]
        wanted = sorted({k for b, keys in enumerate(all_keys) if ok[b] for k in keys})
        values = dict(zip(wanted, self._conn.c.batch_get(wanted) if wanted else [], strict=True))
        out = []
        for b, ptr in enumerate(buffer_ptrs):
            if not ok[b]:
                out.append(_failed(lists, b))
                continue
            dst = self._registered_view(ptr)
            per_key = []
            for j, key in enumerate(all_keys[b]):
                d, s, n = all_dst_offsets[b][j], all_src_offsets[b][j], all_sizes[b][j]
                if not _lists_match(d, s, n):
                    per_key.append([E.INVALID_PARAMS] * max(len(d), 1))
                    continue
                value = values.get(key)
                per_key.append([_copy_range(dst, value, *r) for r in zip(d, s, n, strict=True)])
            out.append(per_key)
        return out


def _nested(value: Any, leaf: type, depth: int) -> bool:
    if depth == 0:
        return isinstance(value, leaf) and not isinstance(value, bool)
    return isinstance(value, list) and all(_nested(v, leaf, depth - 1) for v in value)


def _failed(lists: tuple[list, ...], b: int) -> list[list[int]]:
    """-600 for every key of buffer ``b`` (one per destination offset, at least one)."""
    keys, dsts = (lists[0][b] if b < len(lists[0]) else [""]), lists[1]
    dst = dsts[b] if b < len(dsts) and isinstance(dsts[b], list) else []
    return [
        [E.INVALID_PARAMS] * max(len(dst[j]) if j < len(dst) else 1, 1) for j in range(len(keys))
    ]


def _copy_range(
    dst: memoryview | None, value: bytearray | StoreError | None, d: int, s: int, n: int
) -> int:
    if dst is None:
        return E.INVALID_PARAMS
    if isinstance(value, StoreError) or value is None:
        return value.code if isinstance(value, StoreError) else E.OBJECT_NOT_FOUND
    if n < 0 or d < 0 or s < 0 or d + n > dst.nbytes or s + n > len(value):
        return E.INVALID_PARAMS
    dst[d : d + n] = value[s : s + n]
    return n
