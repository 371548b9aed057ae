"""A network read's data section received straight into its destinations and summed as it
lands (``copysum.c``'s ``kvc_recv_sum_many``), the GIL released for the whole section.

Why C: a load of 56 blocks is 1,680 destination ranges. Received into scratch and then
scattered, every byte crosses memory twice; received range by range from Python, each range
costs a call and a view. Here one call per frame fills every range with ``recvmsg`` (256 ranges
or 512 KiB per call) and hashes each piece right after the kernel wrote it, while it is in L2.
"""

from __future__ import annotations

import ctypes
import socket
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvcake.core import native
from kvcake.core.errors import TruncatedFrame
from kvcake.core.native import StopFlag, Table


class Stopped(Exception):
    """The stop flag was set while the section was arriving: the destinations are void."""


def _fn() -> Any:
    lib = native._LIB
    assert lib is not None, "kvcake.core.native is not built (make native)"
    fn = lib.kvc_recv_sum_many
    if fn.restype is not ctypes.c_int or fn.argtypes is None:
        fn.argtypes = (
            (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p)
            + (ctypes.c_size_t,)
            + (ctypes.c_void_p,) * 7
            + (ctypes.c_long,)
        )
        fn.restype = ctypes.c_int
    return fn


def recv_sum_many(
    sock: socket.socket,
    pre: memoryview,
    values: Sequence[tuple[Table, Sequence[int] | None]],
    chunk: int,
    stop: StopFlag | None,
    timeout_s: float,
) -> list[list[int]]:
    """Receive the values' bytes in order: value j's ranges (``Table``: sorted, tiling its
    span from the table's first offset) are filled from ``pre`` (read-ahead bytes, first) and
    then ``sock``; each ``chunk`` of a value's span is summed with its seed as it lands (the
    value's seeds, or None for all: no sums, and [] returned per value). Raises Stopped,
    TruncatedFrame (EOF), TimeoutError (``timeout_s`` without a byte), OSError, ValueError
    (ranges that do not tile)."""
    summed = values and values[0][1] is not None
    ns: list[int] = []
    sfirst: list[int] = []
    seeds: list[int] = []
    for table, value_seeds in values:
        ns.append(table.nbytes)
        sfirst.append(len(seeds))
        if summed:
            assert value_seeds is not None
            if len(value_seeds) != -(-table.nbytes // chunk):
                raise ValueError(f"{len(value_seeds)} seeds for a span of {table.nbytes} bytes")
            seeds.extend(value_seeds)
    parts = [(t.addrs, t.lengths) if t.dense else _live(t) for t, _ in values]
    dst = np.ascontiguousarray(np.concatenate([a for a, _ in parts]))
    ln = np.ascontiguousarray(np.concatenate([n for _, n in parts]))
    rfirst = np.zeros(len(values) + 1, np.uint64)
    rfirst[1:] = np.cumsum([len(n) for _, n in parts])
    n_arr = np.asarray(ns, np.uint64)
    seed_arr = np.asarray(seeds, np.uint64)
    sfirst_arr = np.asarray(sfirst, np.uint64)  # named: a temporary's memory would be freed
    out = np.zeros(max(1, len(seeds)), np.uint64)
    code = _fn()(
        sock.fileno(),
        native.address(pre) if pre.nbytes else None,
        pre.nbytes,
        len(values),
        n_arr.ctypes.data,
        chunk,
        seed_arr.ctypes.data if summed else None,
        out.ctypes.data,
        sfirst_arr.ctypes.data,
        dst.ctypes.data,
        ln.ctypes.data,
        rfirst.ctypes.data,
        ctypes.addressof(stop.value) if stop is not None else None,
        int(timeout_s * 1000),
    )
    _raise_for(code)
    sums = out.tolist()
    ends = [*sfirst[1:], len(seeds)]
    return [sums[a:b] for a, b in zip(sfirst, ends, strict=True)]


def _raise_for(code: int) -> None:
    if code == 0:
        return
    if code == -1:
        raise ValueError("kvc_recv_sum_many: ranges do not tile their values")
    if code == -2:
        raise TruncatedFrame("peer closed inside a data section")
    if code == -3:
        raise TimeoutError("no byte of the data section arrived in time")
    if code == -4:
        raise Stopped("stopped while the data section was arriving")
    raise OSError(-5 - code, f"recvmsg: errno {-5 - code}")


def _live(table: Table) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """(addresses, lengths) of a table's non-empty ranges."""
    keep = table.lengths > 0
    return table.addrs[keep], table.lengths[keep]
