"""Reads that land each byte once, straight in the caller's scattered destinations (issue 37's
TCP loads), summed as they land.

A value whose destinations are many ranges (a vLLM block: one per KV plane) that tile its
span is asked for as one entry of a vectored ``ReadV`` frame (its span is contiguous in the
segment, so the server sends it as it sends any range); the reply's data section is received
by one C call per frame (:func:`kvcake.core.native.netrecv.recv_sum_many`), which cuts the
stream into the ranges as it lands, each chunk summed while it is in the cache. The lanes'
path lands a slice in one contiguous buffer, so a scattered value would cross memory twice
(scratch, then the ranges): measured 0.42x of the engine's own TCP bandwidth that way
(docs/benchmarks.md, "Pool loads").

Bytes reach the caller's memory only inside ``gate.commit()``, held for one frame's data; its
stop flag ends the C call within ~10 ms, so once the gate's owner has given up no byte lands
(``store.readguard.ReadGuard`` is such a gate). A frame that ends early breaks the connection.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from typing_extensions import Buffer

from kvcake.core import framing
from kvcake.core.errors import MalformedFrame
from kvcake.core.native import StopFlag, Table
from kvcake.core.native.netrecv import Stopped, recv_sum_many
from kvcake.transfer.errors import TransferError
from kvcake.transfer.pool import Endpoint
from kvcake.transfer.protocol import CODEC, MAX_ENTRIES, AckV, Fail, ReadV
from kvcake.transfer.stream import send_all
from kvcake.transfer.vector import read_reply, remote_error


class Gate(Protocol):
    """Admits bytes into a caller's memory: ``commit()`` raises once the caller gave up, and
    ``stop`` (set first by the giving up) ends a receive in progress."""

    stop: StopFlag | None

    def commit(self) -> contextlib.AbstractContextManager[None]: ...


class Cancelled(TransferError):
    """The gate closed while a scattered read was landing: its destinations are void."""


@dataclass(frozen=True, slots=True)
class ScatterRead:
    """One value read from ``offset`` of a segment (its byte 0) into ``table``'s ranges,
    which tile the value's span ``[table.start, table.end)`` (chunk aligned); ``seeds``: one
    per ``chunk`` of the span (None: not summed)."""

    offset: int
    table: Table
    seeds: Sequence[int] | None


def plan(reads: Sequence[ScatterRead], max_bytes: int, lanes: int) -> list[list[list[int]]] | None:
    """Indexes of ``reads`` cut into at most ``lanes`` runs of about equal bytes, in order (one
    per connection, so a large load keeps two sockets and both sides' cores busy, as the lanes
    of a batch do), each run cut into frames of whole values (one entry each, at most
    MAX_ENTRIES values and ``max_bytes``). None: a value alone exceeds a frame (read it another
    way). The lanes are balanced by value, not by frame: whole frames over two lanes left one
    lane with 3 of 6 frames' worth plus (48.7 against 33.9 MB of an 82.6 MB load)."""
    sizes = [r.table.nbytes for r in reads]
    if any(b > max_bytes for b in sizes):
        return None
    total = sum(sizes)
    lanes = max(1, min(lanes, len(reads)))
    runs: list[list[int]] = [[] for _ in range(lanes)]
    acc = 0
    for i, b in enumerate(sizes):  # a value goes to the lane that holds its middle byte
        runs[min(lanes - 1, int((acc + b / 2) * lanes / max(1, total)))].append(i)
        acc += b
    return [_frames(run, sizes, max_bytes) for run in runs if run]


def _frames(run: list[int], sizes: Sequence[int], max_bytes: int) -> list[list[int]]:
    out: list[list[int]] = []
    cur: list[int] = []
    size = 0
    for i in run:
        if cur and (len(cur) >= MAX_ENTRIES or size + sizes[i] > max_bytes):
            out.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += sizes[i]
    if cur:
        out.append(cur)
    return out


Outcome = list[int] | TransferError  # a value's sums (or [] unsummed), or its refusal


def run(
    ep: Endpoint,
    segment: str,
    reads: Sequence[ScatterRead],
    groups: list[list[int]],
    gate: Gate | None,
    chunk: int,
    timeout_s: float,
) -> dict[int, Outcome]:
    """Send every frame of ``groups``, then land each reply's data (see the module doc); the
    outcome of each read the groups name. A broken stream raises (the caller drops the
    connection); Stopped raises Cancelled."""
    rids = []
    parts: list[Buffer] = []
    for g in groups:
        rids.append(ep.next_rid())
        parts.append(_request(rids[-1], segment, [reads[i] for i in g]))
    send_all(ep.sock, parts)
    out: dict[int, Outcome] = {}
    for rid, g in zip(rids, groups, strict=True):
        got = _reply(ep, rid, [reads[i] for i in g], gate, chunk, timeout_s)
        for i, o in zip(g, got, strict=True):
            out[i] = o
    return out


def striped(
    executor: Executor,
    read: Callable[[list[list[int]]], dict[int, Outcome] | None],
    runs: list[list[list[int]]],
    count: int,
) -> list[Outcome] | None:
    """``read`` each run of frames on its own connection: the first in this thread, the
    others on ``executor``. Every lane has ended when this returns or raises (a Cancelled
    stops them all: they share the gate's stop flag). None: a lane's path failed."""
    futures = [executor.submit(read, groups) for groups in runs[1:]]
    parts: list[dict[int, Outcome] | None] = []
    error: Exception | None = None
    calls: list[Callable[[], dict[int, Outcome] | None]] = [functools.partial(read, runs[0])]
    calls += [f.result for f in futures]
    for call in calls:
        try:
            parts.append(call())
        except Exception as exc:  # raised once every lane has ended
            error = error or exc
    if error is not None:
        raise error
    out: dict[int, Outcome] = {}
    for p in parts:
        if p is None:
            return None
        out.update(p)
    return [out[i] for i in range(count)]


def _request(rid: int, segment: str, reads: Sequence[ScatterRead]) -> bytes:
    """One entry per value: its whole span, contiguous in the segment (the ranges tile it).
    The receive cuts the stream into the ranges; asking range by range instead cost the
    server a slice and an iovec per range (1,680 a load) and measured slower."""
    rows = [(0, r.offset + r.table.start, r.table.nbytes) for r in reads]
    desc = np.asarray(rows, "<i8").tobytes()
    meta = CODEC.encode(ReadV([segment], desc))
    return framing.pack_header(rid, len(meta), 0) + meta


def _reply(
    ep: Endpoint,
    rid: int,
    reads: Sequence[ScatterRead],
    gate: Gate | None,
    chunk: int,
    timeout_s: float,
) -> list[Outcome]:
    msg, data_len = read_reply(ep.reader, rid)
    if type(msg) is Fail:
        if data_len:
            raise MalformedFrame("a Fail reply carries no data")
        return [remote_error(msg.kind, msg.message)] * len(reads)
    if type(msg) is not AckV:
        raise MalformedFrame(f"unexpected reply {type(msg).__name__}")
    if msg.failed:  # rare (a range outside the segment): drop this frame's data, refuse it
        ep.reader.skip(data_len)
        kind, message = msg.failed[0][1], msg.failed[0][2]
        return [remote_error(kind, message)] * len(reads)
    if data_len != sum(r.table.nbytes for r in reads):
        raise MalformedFrame(f"reply of {data_len} bytes for {len(reads)} values")
    pre = ep.reader.take(data_len)
    values = [(r.table, r.seeds) for r in reads]
    try:
        with gate.commit() if gate is not None else contextlib.nullcontext():
            stop = gate.stop if gate is not None else None
            return list(recv_sum_many(ep.sock, pre, values, chunk, stop, timeout_s))
    except Stopped as exc:
        raise Cancelled(str(exc)) from exc
