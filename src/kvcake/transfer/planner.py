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


def coalesce(requests: list[tuple[int, TransferRequest]]) -> list[Run]:
    """Merge contiguous neighbours among already-validated ``(index, request)`` pairs."""
    ordered = sorted(
        requests,
        key=lambda ir: (ir[1].op, ir[1].local_segment, ir[1].target_segment, ir[1].target_offset),
    )
    runs: list[Run] = []
    for i, r in ordered:
        last = runs[-1] if runs else None
        if (
            last is not None
            and last.op == r.op
            and last.local_segment == r.local_segment
            and last.target_segment == r.target_segment
            and last.local_offset + last.length == r.local_offset
            and last.target_offset + last.length == r.target_offset
        ):
            last.length += r.length
            last.members.append(i)
        else:
            runs.append(
                Run(
                    r.op,
                    r.local_segment,
                    r.local_offset,
                    r.target_segment,
                    r.target_offset,
                    r.length,
                    [i],
                )
            )
    return runs
