"""Coalescing of contiguous neighbouring requests, and the inline path's plan (pure logic).

Two requests merge when they have the same op, local segment and target segment and both their
local and target ranges continue each other. Order within a batch is not guaranteed anyway (its
slices run in parallel), so sorting to find neighbours changes no semantics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvcake.core.ids import BatchId
from kvcake.transfer.batch import OK, failure
from kvcake.transfer.errors import TransferError
from kvcake.transfer.types import BatchResult, Op, TransferRequest


@dataclass
class Run:
    """A coalesced range: the first request's coordinates, the total length, the members."""

    op: Op
    local_segment: str
    local_offset: int
    target_segment: str
    target_offset: int
    length: int
    members: list[int] = field(default_factory=list)


Item = tuple[int, int, int, int]  # (target offset, local offset, length, request index)


def merge(items: list[Item]) -> list[tuple[int, int, int, list[int]]]:
    """Coalesce the validated requests of one (op, local segment, target segment) group:
    ``(local offset, target offset, length, members)`` per contiguous run."""
    items.sort()
    runs: list[tuple[int, int, int, list[int]]] = []
    lo_end = to_end = -1
    for to, lo, n, i in items:
        if lo == lo_end and to == to_end:
            plo, pto, pn, members = runs[-1]
            runs[-1] = (plo, pto, pn + n, members)
            members.append(i)
        else:
            runs.append((lo, to, n, [i]))
        lo_end, to_end = lo + n, to + n
    return runs


def coalesce(requests: list[tuple[int, TransferRequest]]) -> list[Run]:
    """Merge contiguous neighbours among already-validated ``(index, request)`` pairs."""
    groups: dict[tuple[Op, str, str], list[Item]] = {}
    for i, r in requests:
        key = (r.op, r.local_segment, r.target_segment)
        groups.setdefault(key, []).append((r.target_offset, r.local_offset, r.length, i))
    return [
        Run(op, ls, lo, ts, to, n, members)
        for (op, ls, ts), items in groups.items()
        for lo, to, n, members in merge(items)
    ]


Merged = list[tuple[int, int, int, list[int]]]  # merge()'s runs


def uniform_runs(
    requests: Sequence[TransferRequest], local_size: int, target_size: int
) -> tuple[Op, Merged, int] | None:
    """``(op, merged runs, total bytes)`` when every request has the first one's op, local
    and target segment and fence and is in bounds of both (sizes given); ``None`` otherwise (the batch
    then goes through the general planner, which fails bad requests alone)."""
    r0 = requests[0]
    op, lname, tname, fence = r0.op, r0.local_segment, r0.target_segment, r0.fence
    if not isinstance(op, Op):
        return None
    items: list[Item] = []
    total = 0
    for i, r in enumerate(requests):
        lo, to, n = r.local_offset, r.target_offset, r.length
        if (
            r.op is not op
            or r.local_segment != lname
            or r.target_segment != tname
            or r.fence != fence
            or not (n > 0 and lo >= 0 and lo + n <= local_size and to >= 0)
            or to + n > target_size
        ):
            return None
        items.append((to, lo, n, i))
        total += n
    return op, merge(items), total


def run_results(
    batch_id: BatchId, size: int, runs: Merged, out: TransferError | dict[int, TransferError] | None
) -> BatchResult:
    """The batch's per-request outcomes from its runs' (``out``: one error for all, per-run
    errors by run index, or ``None`` = all succeeded); each run's outcome goes to its members."""
    if out is None:
        return BatchResult(batch_id, (OK,) * size)
    results = [OK] * size
    for k, (_, _, _, members) in enumerate(runs):
        err = out if isinstance(out, TransferError) else out.get(k)
        if err is not None:
            res = failure(err)
            for i in members:
                results[i] = res
    return BatchResult(batch_id, tuple(results))
