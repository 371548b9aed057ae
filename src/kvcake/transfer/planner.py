"""Coalescing of contiguous neighbouring requests (pure logic).

Two requests merge when they have the same op, local segment and target segment and both their
local and target ranges continue each other. Order within a batch is not guaranteed anyway (its
slices run in parallel), so sorting to find neighbours changes no semantics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcake.transfer.types import Op, TransferRequest


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
