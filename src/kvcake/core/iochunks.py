"""How many bytes one socket call moves.

Every bulk ``sendmsg`` / ``recv_into`` / ``recvmsg_into`` of kvcake asks the kernel for at most
:data:`IO_CALL_BYTES`. Loopback TCP moved bulk data 1.5-2.5x faster that way than with one call
for a whole 1-16 MiB batch (docs/transfer.md, "Bytes per socket call"): a call of many MiB
keeps the socket locked while the peer's segments and window updates queue behind it, so the
two sides stop overlapping; a call of a few hundred KiB lets the receiver copy one chunk out
while the sender copies the next one in. Measured with a bare two-process loop on 2 vCPUs:
128 KiB calls were slower than one unbounded call, 512 KiB the fastest of 128 KiB-4 MiB.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from typing_extensions import Buffer

IO_CALL_BYTES = 512 * 1024
IOV_CHUNK = 512  # iovecs per sendmsg / recvmsg_into (the kernel's IOV_MAX is 1024)


def nbytes(parts: Sequence[Buffer]) -> int:
    total = 0
    for p in parts:
        total += len(p)  # type: ignore[arg-type]
    return total


def io_groups(
    parts: Sequence[Buffer], cap: int = IO_CALL_BYTES, max_parts: int = IOV_CHUNK
) -> Iterator[list[memoryview]]:
    """``parts`` (bytes or 1-D byte views, in order) cut into consecutive groups of at most
    ``cap`` bytes and ``max_parts`` parts, one socket call each; a part that straddles a
    boundary is split (views, no copies). Empty parts are dropped."""
    if cap <= 0 or max_parts <= 0:
        raise ValueError(f"cap and max_parts must be > 0, got {cap}, {max_parts}")
    group: list[memoryview] = []
    room = cap
    for p in parts:
        v = memoryview(p)
        if v.itemsize != 1 or v.ndim != 1:
            v = v.cast("B")
        while v.nbytes:
            if len(group) == max_parts or not room:
                yield group
                group, room = [], cap
            k = min(room, v.nbytes)
            group.append(v if k == v.nbytes else v[:k])
            v = v[k:]
            room -= k
    if group:
        yield group
