"""A registered staging buffer that turns a batch of small copies into ONE Transfer Engine
batch (one plan, one task per transport) instead of one engine call per value.

Owned by one :class:`~kvcake.store.client.Client`; a lock serialises its use (a caller that
finds it busy or too small falls back to per-value copies, so it never blocks correctness).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kvcake.core.ids import SegmentName
from kvcake.store.allocator import aligned
from kvcake.store.errors import TransferFailed
from kvcake.transfer.engine import TransferEngine
from kvcake.transfer.types import Op, TransferRequest

MAX_ITEM = 256 * 1024  # larger values go direct: the extra memcpy would cost more than it saves


class Staging:
    def __init__(self, engine: TransferEngine, name: str, size: int = 8 * 1024 * 1024):
        self.engine = engine
        self.name = SegmentName(name)
        self.buf = bytearray(size)
        self.view = memoryview(self.buf)
        self.lock = threading.Lock()
        engine.register_memory(name, self.buf)

    def fits(self, sizes: list[int]) -> bool:
        return (
            len(sizes) > 1
            and max(sizes) <= MAX_ITEM
            and sum(aligned(s) for s in sizes) <= len(self.buf)
        )

    def _layout(self, sizes: list[int]) -> list[int]:
        offs, pos = [], 0
        for s in sizes:
            offs.append(pos)
            pos += aligned(s)
        return offs

    def write(self, items: list[tuple[memoryview, str, int, int]]) -> list[Exception | None]:
        """Copy each (data, target segment, target offset, fence); per-item outcome."""
        offs = self._layout([v.nbytes for v, _, _, _ in items])
        reqs = []
        for (view, seg, toff, fence), off in zip(items, offs, strict=True):
            self.view[off : off + view.nbytes] = view
            reqs.append(
                TransferRequest(
                    Op.WRITE, self.name, off, SegmentName(seg), toff, view.nbytes, fence
                )
            )
        return self._run(reqs)

    def read(
        self,
        items: list[tuple[int, str, int]],
        take: Callable[[int, memoryview], bytearray | Exception] | None = None,
    ) -> list[bytearray | Exception]:
        """Fetch each (size, target segment, target offset) into a new bytearray; ``take(j,
        view)`` makes item ``j``'s result from its staged bytes (the reader verifies them
        there, while copying them out)."""
        offs = self._layout([n for n, _, _ in items])
        reqs = [
            TransferRequest(Op.READ, self.name, off, SegmentName(seg), toff, n)
            for (n, seg, toff), off in zip(items, offs, strict=True)
        ]
        out: list[bytearray | Exception] = []
        for j, ((n, _, _), off, err) in enumerate(zip(items, offs, self._run(reqs), strict=True)):
            if err is not None:
                out.append(err)
            elif take is not None:
                out.append(take(j, self.view[off : off + n]))
            else:
                out.append(bytearray(self.view[off : off + n]))
        return out

    def _run(self, reqs: list[TransferRequest]) -> list[Exception | None]:
        result = self.engine.transfer(reqs)
        return [
            None if r.ok else TransferFailed(f"{r.error_type}: {r.error}") for r in result.results
        ]
