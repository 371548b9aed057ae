"""What checksums cost: the store's put and get with verification on and off, interleaved.

``python benchmarks/store_bench.py --integrity [--protocol auto|tcp] [--repeats 11] [--slice 16]``

One master, one store-server, two clients in this process (``verify=True`` and ``verify=False``)
against the same node. Each round puts and gets ``calls`` operations per client, cut into slices
of ``--slice`` operations that alternate between the two clients (ABBA...), so a change of the
machine's state -- another process waking, the master's socket switching between its spinning
and sleeping receive, the CPU clock -- lands on both within a few milliseconds instead of on
one whole round of one mode. ``--slice 0`` is the older measurement: one whole round per mode,
rounds alternating.

A round's ratio is the time the operations took without verification over the time they took
with it (1.0x = free); a cell's figure is the geometric mean over rounds (use an even
``--repeats``: both orders then count equally; see ``HEADER``), the median beside it. ``cpu``: the same ratio of CPU
time summed over the client, master and store-server (the servers' from /proc, in 10 ms ticks:
meaningful summed over a round, not per slice).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mooncake_peer as peer

Op = Callable[[int], None]


@dataclass
class Tally:
    """Time spent by one mode in one round (wall seconds, CPU seconds, operations)."""

    wall: float = 0.0
    cpu: float = 0.0
    ops: int = 0
    walls: list[float] = field(default_factory=list)


def ops_for(client: Any, keys: list[list[str]], value: bytes, batch: int) -> tuple[Op, Op]:
    """(put i, get i) of ``keys[i]``; a failed operation raises (a bench must not time errors)."""
    if batch == 1:

        def put1(i: int) -> None:
            client.put(keys[i][0], value)

        def get1(i: int) -> None:
            got = client.get(keys[i][0])
            assert len(got) == len(value), (len(got), len(value))

        return put1, get1

    def put(i: int) -> None:
        errs = client.batch_put(keys[i], [value] * batch)
        assert not any(errs), errs

    def get(i: int) -> None:
        got = client.batch_get(keys[i])
        assert all(len(g) == len(value) for g in got), [type(g) for g in got]

    return put, get


def _slices(calls: int, size: int) -> list[range]:
    size = size or calls
    return [range(a, min(calls, a + size)) for a in range(0, calls, size)]


def interleaved(
    runs: dict[bool, Op], calls: int, per_call: int, slice_ops: int, first: int = 0
) -> dict[bool, Tally]:
    """Run ``runs[v](i)`` for i < calls for both modes, slice by slice, the first mode of each
    slice alternating (``first``: the round's number, so that a round of one slice -- large
    values -- alternates with the next round); returns each mode's tally."""
    tally = {v: Tally() for v in runs}
    for n, idx in enumerate(_slices(calls, slice_ops), start=first):
        order = (True, False) if n % 2 == 0 else (False, True)
        for v in order:
            c0 = peer.cpu_seconds()
            t0 = time.perf_counter()
            for i in idx:
                runs[v](i)
            dt = time.perf_counter() - t0
            tally[v].cpu += peer.cpu_seconds() - c0
            tally[v].wall += dt
            tally[v].walls.append(dt)
            tally[v].ops += len(idx) * per_call
    return tally


def cell(
    clients: dict[bool, Any], label: str, size: int, batch: int, repeats: int, slice_ops: int
) -> dict[str, list[float]]:
    """Per round: put and get wall and CPU ratios (off time over on time) and on-mode op/s."""
    value = os.urandom(size)
    calls = max(3, min(300, (128 << 20) // (size * batch)))
    out: dict[str, list[float]] = {
        k: [] for k in ("put", "get", "put_cpu", "get_cpu", "put_ops", "get_ops")
    }
    for r in range(repeats):
        keys = {
            v: [[f"{label}/{batch}/{v}/{r}/{i}/{j}" for j in range(batch)] for i in range(calls)]
            for v in clients
        }
        fns = {v: ops_for(clients[v], keys[v], value, batch) for v in clients}
        for k, name in enumerate(("put", "get")):
            t = interleaved({v: fns[v][k] for v in clients}, calls, batch, slice_ops, r)
            out[name].append(t[False].wall / t[True].wall)
            out[f"{name}_cpu"].append(t[False].cpu / t[True].cpu if t[True].cpu else float("nan"))
            out[f"{name}_ops"].append(t[True].ops / t[True].wall)
        for c in clients.values():
            c.remove_all(force=True)
    return out


def report(label: str, batch: int, got: dict[str, list[float]]) -> str:
    """One markdown row: per-round ratios, then their median."""

    def rounds(xs: list[float]) -> str:
        return ", ".join(f"{x:.2f}" for x in xs)

    med = {k: statistics.median(v) for k, v in got.items()}
    gm = {k: statistics.geometric_mean(got[k]) for k in ("put", "get")}
    return (
        f"| {label} | {batch} | {rounds(got['put'])} | **{gm['put']:.2f}x** | {med['put']:.2f}x "
        f"| {rounds(got['get'])} | **{gm['get']:.2f}x** | {med['get']:.2f}x "
        f"| {med['put_cpu']:.2f}x | {med['get_cpu']:.2f}x "
        f"| {med['put_ops']:,.0f} | {med['get_ops']:,.0f} |"
    )


# A cell's figure is the geometric mean over rounds: rounds alternate which mode runs first,
# and where a round is one slice (large values) the mode that runs first is measurably slower
# whatever it is, so per-round ratios alternate high/low and a median picks one side; the
# geometric mean of an even number of rounds weighs both orders equally (the median is shown).
HEADER = (
    "| size | batch | put off/on per round | put | put median | get off/on per round | get "
    "| get median | put cpu | get cpu | put op/s (on) | get op/s (on) |\n"
    "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"
)
