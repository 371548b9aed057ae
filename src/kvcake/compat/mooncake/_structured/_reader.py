"""Reading payload bytes back. A payload is a list of chunks ``{"key", "bytes"}``; a read names a
byte range of the concatenation. Fast paths need buffer registration: a whole payload in one
``batch_get_into``, one whole chunk with ``get_into``, any range with one ``get_into_ranges``;
without them every chunk touched is a plain ``get``."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kvcake.compat.mooncake._structured._port import Port, address

Fragment = tuple[str, int, int, int, int]  # key, chunk size, dst offset, src offset, size


def fragments(chunks: Sequence[Mapping[str, Any]], offset: int, length: int) -> list[Fragment]:
    """The pieces of the range ``[offset, offset+length)``, destination offsets from 0."""
    out, start, end = [], 0, offset + length
    for chunk in chunks:
        size = int(chunk["bytes"])
        lo, hi = max(offset, start), min(end, start + size)
        if lo < hi:
            out.append((chunk["key"], size, lo - offset, lo - start, hi - lo))
        start += size
    return out


class PayloadReader:
    def __init__(self, port: Port) -> None:
        self.port = port

    def read_all(self, spec: Mapping[str, Any]) -> bytes:
        """The whole payload (``batch_get_into`` when the store can register, else ``get``)."""
        total = int(spec["bytes"])
        if total == 0:
            return b""
        out = bytearray(total)
        batch = self.port.fn("batch_get_into")
        if batch is None or not self.port.can_register:
            self._copy(spec["chunks"], out, 0, total)
            return bytes(out)
        keys = [c["key"] for c in spec["chunks"]]
        sizes = [int(c["bytes"]) for c in spec["chunks"]]
        base = address(out)
        ptrs = [base + off for off in np.cumsum([0, *sizes[:-1]]).tolist()]
        with self.port.registered([(base, total)], "bundle payload"):
            got = batch(keys, ptrs, sizes)
        if len(got) != len(keys):
            raise RuntimeError(f"batch_get_into returned {len(got)} results for {len(keys)}")
        for key, want, n in zip(keys, sizes, got, strict=True):
            if n != want:
                raise RuntimeError(f"batch_get_into failed for {key}: expected {want}, got {n}")
        return bytes(out)

    def read_range(self, spec: Mapping[str, Any], offset: int, length: int) -> bytes:
        out = bytearray(length)
        if length:
            self.read_range_into(spec, out, offset, allow_get_into=False)
        return bytes(out)

    def read_range_into(
        self,
        spec: Mapping[str, Any],
        dest: bytearray | np.ndarray,
        offset: int,
        *,
        allow_get_into: bool = True,
    ) -> None:
        """``len(dest)`` bytes from ``offset`` into ``dest`` (registered for the read)."""
        length = dest.nbytes if isinstance(dest, np.ndarray) else len(dest)
        if length == 0:
            return
        if self.port.can_register and self._has_fetch(spec, offset, length, allow_get_into):
            base = address(dest)
            with self.port.registered([(base, length)], "structured payload"):
                self.fetch(spec["chunks"], base, offset, length, allow_get_into=allow_get_into)
            return
        self._copy(spec["chunks"], dest, offset, length)

    def read_raw(self, spec: Mapping[str, Any], ptr: int, offset: int, length: int) -> None:
        """Into caller memory the caller registered (a tensor-object buffer or a pre-registered
        raw destination); plain ``get`` when the store has no ranged read."""
        if length == 0:
            return
        if not self.fetch(spec["chunks"], ptr, offset, length, allow_get_into=False):
            staged = bytearray(length)
            self._copy(spec["chunks"], staged, offset, length)
            ctypes.memmove(ptr, bytes(staged), length)

    def _has_fetch(
        self, spec: Mapping[str, Any], offset: int, length: int, allow_get_into: bool
    ) -> bool:
        if self.port.fn("get_into_ranges") is not None:
            return True
        whole = len(spec["chunks"]) == 1 and offset == 0 and spec["chunks"][0]["bytes"] == length
        return allow_get_into and whole and self.port.fn("get_into") is not None

    def fetch(
        self,
        chunks: Sequence[Mapping[str, Any]],
        ptr: int,
        offset: int,
        length: int,
        *,
        allow_get_into: bool,
    ) -> bool:
        """One store call into registered memory at ``ptr``; False if the store has none."""
        get_into = self.port.fn("get_into")
        whole = len(chunks) == 1 and offset == 0 and int(chunks[0]["bytes"]) == length
        if allow_get_into and whole and get_into is not None:
            n = get_into(chunks[0]["key"], ptr, length)
            if n != length:
                raise RuntimeError(
                    f"get_into failed for {chunks[0]['key']}: expected {length}, got {n}"
                )
            return True
        ranges = self.port.fn("get_into_ranges")
        if ranges is None:
            return False
        parts = fragments(chunks, offset, length)
        keys = [p[0] for p in parts]
        sizes = [[p[4]] for p in parts]
        got = ranges([ptr], [keys], [[[p[2]] for p in parts]], [[[p[3]] for p in parts]], [sizes])
        if len(got) != 1 or len(got[0]) != len(keys):
            raise RuntimeError(f"get_into_ranges returned an invalid result for {len(keys)} keys")
        for key, want, have in zip(keys, sizes, got[0], strict=True):
            if list(have) != want:
                raise RuntimeError(f"get_into_ranges failed for {key}: expected {want}, got {have}")
        return True

    def _copy(
        self, chunks: Sequence[Mapping[str, Any]], dest: Any, offset: int, length: int
    ) -> None:
        view = memoryview(dest).cast("B")
        for key, size, dst, src, n in fragments(chunks, offset, length):
            data = self.port.get(key, size)
            view[dst : dst + n] = memoryview(data)[src : src + n]
