"""Public value types of the Transfer Engine: requests, segment descriptors, batch outcomes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from kvcake.core.ids import BatchId, SegmentName
from kvcake.transfer.errors import TransferError

# ``landed(start, end)``: for a read, bytes ``[start, end)`` of its local buffer have just
# arrived, in order within one attempt of one slice, and nothing else writes them before the
# next call (the reader may hash them while they are in the cache); for a write, those bytes
# have just been handed to the kernel and the reply is not read yet (the writer may hash them
# while the send has left them in the cache and the peer is still taking them in, so the hash
# overlaps the transfer instead of delaying it). Called in the thread that moves them (several
# lanes may call at once); a retried slice is reported again. The shared-memory transport
# copies in one go and does not call it.
Landed = Callable[[int, int], None]


class Op(IntEnum):
    """Direction seen from the initiator: READ copies target -> local, WRITE local -> target."""

    READ = 0
    WRITE = 1


@dataclass(frozen=True)
class TransferRequest:
    """Move ``length`` bytes between ``local_segment[local_offset:]`` (registered in this
    engine) and ``target_segment[target_offset:]`` (anywhere in the cluster).

    Values are not validated here: a bad request fails alone when its batch runs, with a typed
    error in its :class:`RequestResult` (so one bad entry never sinks a whole batch)."""

    op: Op
    local_segment: SegmentName
    local_offset: int
    target_segment: SegmentName
    target_offset: int
    length: int
    fence: int = 0  # a write's allocation (transfer/fences.py); 0 = not fenced


@dataclass(frozen=True)
class PathInfo:
    """One way to reach a segment's owner: a transfer-server address ("NIC") and its tier
    (0 = preferred, 1 = secondary) — one row of the paper's topology matrix."""

    address: str  # "host:port"
    tier: int = 0


@dataclass(frozen=True)
class SegmentInfo:
    """What the directory knows about a segment. ``shm_path`` is set when the memory is a
    ``/dev/shm`` file that same-host peers may map; ``host_id`` tells whether they share a host."""

    name: SegmentName
    owner: str
    host: str
    host_id: str
    size: int
    paths: tuple[PathInfo, ...] = ()
    shm_path: str | None = None

    @property
    def shm_backed(self) -> bool:
        return self.shm_path is not None


@dataclass(frozen=True)
class RequestResult:
    """Outcome of one request of a batch: ``error`` is ``None`` on success."""

    ok: bool
    error: str | None = None
    error_type: str | None = None


@dataclass(frozen=True)
class BatchStatus:
    batch_id: BatchId
    total: int
    completed: int
    failed: int

    @property
    def done(self) -> bool:
        return self.completed + self.failed == self.total


@dataclass(frozen=True)
class BatchResult:
    """Per-request outcomes, in the order the requests were submitted."""

    batch_id: BatchId
    results: tuple[RequestResult, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def failed(self) -> list[int]:
        return [i for i, r in enumerate(self.results) if not r.ok]

    def raise_for_errors(self) -> None:
        """Raise :class:`~kvcake.core.errors.TransferError` naming the first failed request."""

        bad = self.failed
        if bad:
            first = self.results[bad[0]]
            raise TransferError(
                f"batch {self.batch_id}: {len(bad)} of {len(self.results)} requests failed; "
                f"request {bad[0]}: {first.error}"
            )
