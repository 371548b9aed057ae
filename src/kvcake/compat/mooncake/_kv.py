"""put / get / upsert / exist / remove on bytes-like values, with Mooncake 0.3.13's results for
the same inputs (recorded against the wheel in tests/compat/test_mooncake_table.py)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from kvcake.compat.mooncake._base import Conn, check_key, returns
from kvcake.compat.mooncake._bytes import SMALL, new_bytes
from kvcake.compat.mooncake._types import BufferHandle, ReplicateConfig
from kvcake.core.buffers import uninitialized_bytearray
from kvcake.core.errors import KvcakeError, StoreError
from kvcake.store import errors as E
from kvcake.store.staging import MAX_ITEM


def _bytes_view(value: Any) -> memoryview:
    if isinstance(value, str):  # pybind11's Buffer does not take str
        raise TypeError("value must support the buffer protocol, got str")
    return memoryview(value).cast("B")


class KvOps:
    """put / get / upsert / exist / remove on bytes-like values. Holds only the Conn and one
    guess (which read path the next ``get_batch`` takes; a race on it costs time, never
    correctness). Values returned are fresh ``bytes`` the caller owns."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        self._big_values = False  # the last get_batch held only values too large for staged reads

    # --- puts ---------------------------------------------------------------------------------

    @returns(int)
    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        check_key(key)
        return self._conn.put(key, _bytes_view(value), config, upsert=False)

    @returns(int)
    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        check_key(key)
        return self._conn.put(key, _bytes_view(value), config, upsert=True)

    def _parts(self, key: str, parts: tuple[Any, ...], config: Any, upsert: bool) -> int:
        check_key(key)
        if not parts:
            return 0  # the wheel accepts a call with no parts and stores nothing
        joined = memoryview(b"".join(_bytes_view(p) for p in parts))
        return self._conn.put(key, joined, config, upsert)

    @returns(int)
    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        return self._parts(key, parts, config, upsert=False)

    @returns(int)
    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        return self._parts(key, parts, config, upsert=True)

    def _batch(self, keys: list[str], values: list[Any], config: Any, upsert: bool) -> int:
        """One int for the whole batch: the first error, 0 when every key went in."""
        if not isinstance(keys, list) or not isinstance(values, list):
            raise TypeError("keys and values must be lists")
        if not keys and not values:
            return 0
        views = [_bytes_view(v) for v in values]
        return next((c for c in self._conn.put_batch(keys, views, config, upsert) if c), 0)

    @returns(int)
    def put_batch(
        self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None
    ) -> int:
        return self._batch(keys, values, config, upsert=False)

    @returns(int)
    def upsert_batch(
        self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None
    ) -> int:
        return self._batch(keys, values, config, upsert=True)

    # --- gets ---------------------------------------------------------------------------------

    def _read_bytes(self, keys: Sequence[str]) -> list[bytes]:
        """One lookup, then each value read into its own fresh ``bytes`` (no staging)."""
        c = self._conn.c
        reply, t0, lease_s = c.reads.lookup(keys)
        out = []
        for key, res in zip(keys, reply.results, strict=True):
            if res.code != 0 or res.size < 2:
                out.append(bytes(c.get(key)) if res.code == 0 else b"")
                continue
            if res.size < SMALL:
                buf = uninitialized_bytearray(res.size)
                value, view = b"", memoryview(buf)
            else:
                value, view = new_bytes(res.size)
            try:
                c.reads.read(key, res, view, t0, lease_s)
            except StoreError:
                out.append(b"")
                continue
            out.append(value or bytes(buf))
        return out

    @returns(b"")
    def get(self, key: str) -> bytes:
        check_key(key)
        return self._read_bytes((key,))[0] if key else b""

    def get_batch(self, keys: list[str]) -> list[bytes]:
        """Large values are read into their ``bytes`` directly; batches of small ones go through
        the client's staged batch read (then one small copy each). Which path a batch takes is
        guessed from the previous batch: a wrong guess costs time, never correctness."""
        if not isinstance(keys, list):
            raise TypeError("keys must be a list of str")
        if self._conn.client is None or not keys:
            return [b""] * max(len(keys), 1)  # the wheel answers [] with [b""]
        try:
            if self._big_values:
                got: list[Any] = self._read_bytes(keys)
                self._big_values = min((len(g) for g in got if g), default=0) > MAX_ITEM
                return got
            got = self._conn.client.batch_get(keys)
        except KvcakeError:
            return [b""] * len(keys)
        sizes = [len(g) for g in got if not isinstance(g, StoreError)]
        self._big_values = bool(sizes) and min(sizes) > MAX_ITEM
        return [b"" if isinstance(g, StoreError) else bytes(g) for g in got]

    @returns(None)
    def get_buffer(self, key: str) -> BufferHandle | None:
        check_key(key)
        got = self._conn.get_or_none(key)
        return None if got is None else BufferHandle(got)

    @returns([])
    def batch_get_buffer(self, keys: list[str]) -> list[BufferHandle | None]:
        got = self._conn.c.batch_get(keys) if keys else []
        return [None if isinstance(g, StoreError) else BufferHandle(g) for g in got]

    @returns(int)
    def get_size(self, key: str) -> int:
        check_key(key)
        return self._conn.c.get_size(key) if key else E.INVALID_PARAMS

    def is_exist(self, key: str) -> int:
        """1 exists, 0 does not, -1 on any error (Mooncake's convention for this call)."""
        check_key(key)
        if self._conn.client is None or not key:
            return -1
        try:
            return int(self._conn.client.is_exist(key))
        except KvcakeError:
            return -1

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        if self._conn.client is None:
            return [-1] * len(keys)
        if not keys:
            return []
        try:
            return [int(b) for b in self._conn.client.batch_is_exist(keys)]
        except KvcakeError:
            return [-1] * len(keys)

    # --- removal ------------------------------------------------------------------------------

    @returns(int)
    def remove(self, key: str, force: bool = False) -> int:
        check_key(key)
        if not key:
            return E.OBJECT_NOT_FOUND
        self._conn.c.remove(key, bool(force))
        return 0

    @returns([])
    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]:
        if not keys:
            return []
        return [r.code if r is not None else 0 for r in self._conn.c.batch_remove(keys, force)]

    @returns(int)
    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        try:
            re.compile(regex_pattern)
        except re.error:
            return E.INVALID_PARAMS
        return self._conn.c.remove_by_regex(regex_pattern, bool(force))

    @returns(int)
    def remove_all(self, force: bool = False) -> int:
        return self._conn.c.remove_all(bool(force))
