"""Writing a payload's chunks. With ``batch_put_from`` and buffer registration the store reads the
caller's memory in place (a read-only or strided chunk is copied once into a private buffer);
otherwise each chunk is a plain ``put``. ``put_mode="parallel"`` (or ``auto`` with many large
chunks) spreads the chunks over up to ``max_inflight_put`` concurrent writers."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from kvcake.compat.mooncake._structured._port import Port, address, check, with_config
from kvcake.compat.mooncake._structured._types import BundleTransferPolicy

AUTO_PARALLEL_MIN_CHUNKS = 8
AUTO_PARALLEL_MIN_BYTES = 64 * 1024**2


@dataclass(frozen=True)
class Chunk:
    key: str
    view: memoryview
    pinned: bool = False  # the caller registered this memory itself


def split(view: memoryview, chunk_bytes: int) -> list[memoryview]:
    return [view[i : i + chunk_bytes] for i in range(0, len(view), chunk_bytes)]


def _source(view: memoryview) -> tuple[Any, int]:
    """(owner, address) of memory the store may read ``view``'s bytes from."""
    if view.c_contiguous and not view.readonly:
        return view, address(view)
    copy = ctypes.create_string_buffer(view.tobytes(), len(view))
    return copy, ctypes.addressof(copy)


class ChunkWriter:
    def __init__(self, port: Port) -> None:
        self.port = port

    def zero_copy_ready(self, chunks: Sequence[Chunk]) -> bool:
        if self.port.fn("batch_put_from") is None:
            return False
        return self.port.can_register or all(c.pinned for c in chunks)

    def write(
        self, chunks: Sequence[Chunk], policy: BundleTransferPolicy, config: Any = None
    ) -> None:
        """Stores every chunk, or none: on failure the chunks written are removed again."""
        if not chunks:
            return
        in_place = policy.copy_mode != "copy" and self.zero_copy_ready(chunks)
        if policy.copy_mode == "zero_copy" and not in_place:
            raise RuntimeError(
                "zero-copy put requested but the store lacks batch_put_from or register_buffer"
            )
        put = self._put_from if in_place else self._put_each
        groups = self._groups(chunks, policy)
        try:
            if len(groups) == 1:
                put(groups[0], config)
            else:
                _run_parallel([lambda g=g: put(g, config) for g in groups])  # type: ignore[misc]
        except Exception:
            self.port.remove_keys([c.key for c in chunks], strict=False)
            raise

    def _groups(
        self, chunks: Sequence[Chunk], policy: BundleTransferPolicy
    ) -> list[Sequence[Chunk]]:
        n = min(policy.max_inflight_put, len(chunks))
        if policy.put_mode == "batch" or n < 2:
            return [chunks]
        if policy.put_mode == "auto":
            size = sum(len(c.view) for c in chunks)
            if len(chunks) < AUTO_PARALLEL_MIN_CHUNKS or size < AUTO_PARALLEL_MIN_BYTES:
                return [chunks]
        step = -(-len(chunks) // n)
        return [chunks[i : i + step] for i in range(0, len(chunks), step)]

    def _put_each(self, chunks: Sequence[Chunk], config: Any) -> None:
        for c in chunks:
            self.port.put(c.key, c.view, config)

    def _put_from(self, chunks: Sequence[Chunk], config: Any) -> None:
        sources = [_source(c.view) for c in chunks]
        regions = [(p, len(c.view)) for c, (_, p) in zip(chunks, sources, strict=True)]
        to_register = [r for r, c in zip(regions, chunks, strict=True) if not c.pinned]
        keys = [c.key for c in chunks]
        with self.port.registered(to_register, "bundle payload") if to_register else nullcontext():
            batch = self.port.fn("batch_put_from")
            assert batch is not None
            results = with_config(
                batch, keys, [p for p, _ in regions], [n for _, n in regions], config=config
            )
        if len(results) != len(keys):
            raise RuntimeError(
                f"batch_put_from returned {len(results)} results for {len(keys)} chunks"
            )
        for key, status in zip(keys, results, strict=True):
            check(status, "batch_put_from", key)
        del sources  # the private copies live until the store has read them


def _run_parallel(jobs: Sequence[Callable[[], None]]) -> None:
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(job) for job in jobs]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]  # type: ignore[misc]
