"""The seeded fault schedule of one nemesis run, and the loop that injects it.

Kinds: SIGSTOP/SIGCONT of the leader, a standby, a storage node, a client or etcd (held
0.5-30 s, log-uniform); SIGKILL and restart (0.5-3 s later) of the leader, a standby, a
storage node or a client; and, with network namespaces, partitions: the leader cut off from
etcd only (clients and storage nodes still reach it), the leader cut off from everybody, a
storage node cut off from everybody. One fault at a time: inject, hold, heal, wait until a
call invoked after the heal is answered (at most ``RECOVERY_CAP_S``), pause 1-3 s.
"""

from __future__ import annotations

import json
import math
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.nemesis.checker import Fault
from benchmarks.nemesis.cluster import Cluster, Proc

KINDS = {  # kind -> weight (leader faults are the interesting ones: drawn more often)
    "pause-leader": 4, "kill-leader": 3, "pause-standby": 1, "kill-standby": 1,
    "pause-store": 2, "kill-store": 1, "pause-client": 1, "kill-client": 1, "pause-etcd": 2,
    "partition-leader-etcd": 3, "partition-leader": 2, "partition-store": 1,
}  # fmt: skip
PARTITIONS = tuple(k for k in KINDS if k.startswith("partition-"))
HOLD_S = (0.5, 30.0)
RESTART_S = (0.5, 3.0)
RECOVERY_CAP_S = 45.0


@dataclass(frozen=True)
class Step:
    kind: str
    hold_s: float  # pause / partition length, or the time from a kill to the restart
    gap_s: float  # quiet time after recovery


def draw(rng: random.Random, kinds: list[str], max_hold_s: float) -> Step:
    kind = rng.choices(kinds, weights=[KINDS[k] for k in kinds])[0]
    if kind.startswith("kill-"):
        hold = rng.uniform(*RESTART_S)
    else:
        lo, hi = HOLD_S[0], min(HOLD_S[1], max_hold_s)
        hold = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    return Step(kind, round(hold, 2), round(rng.uniform(1.0, 3.0), 2))


class Tail:
    """Reads the workers' history files as they grow: which calls were answered when."""

    def __init__(self, run: Path):
        self.run = run
        self.offsets: dict[Path, int] = {}
        self.pending: dict[tuple[Path, int], float] = {}
        self.answered: list[tuple[float, float]] = []  # (invoke, complete)

    def poll(self) -> None:
        for path in sorted(self.run.glob("hist-*.jsonl")):
            with path.open() as fh:
                fh.seek(self.offsets.get(path, 0))
                for line in fh:
                    if not line.endswith("\n"):
                        break
                    self.offsets[path] = self.offsets.get(path, 0) + len(line.encode())
                    self._take(path, line)

    def _take(self, path: Path, line: str) -> None:
        try:
            rec = json.loads(line)
        except ValueError:
            return
        if rec["type"] == "invoke":
            self.pending[(path, rec["i"])] = rec["t"]
            return
        t = self.pending.pop((path, rec["i"]), None)
        if t is not None and rec["type"] in ("ok", "fail"):
            self.answered.append((t, rec["t"]))

    def first_answer(self, after: float) -> float | None:
        """Faults come one after another: answers to calls sent before ``after`` are
        forgotten (the list stays as short as one fault's calls)."""
        self.poll()
        self.answered = [(i, c) for i, c in self.answered if i >= after]
        return min((c for _, c in self.answered), default=None)


def _sleep(s: float, tick: Callable[[], None]) -> None:
    end = time.monotonic() + s
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))
        tick()


def _pick(cl: Cluster, kind: str, rng: random.Random) -> Proc:
    role = kind.split("-", 1)[1]
    if role in ("leader", "leader-etcd", "standby"):
        deadline = time.monotonic() + 30
        while (lead := cl.leader()) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if role == "standby":
            others = [cl.procs[m] for m in cl.masters if cl.procs[m] is not lead]
            return rng.choice([p for p in others if p.alive()] or others)
        return lead or cl.procs[cl.masters[0]]
    pool = {"store": cl.stores, "client": cl.workers, "etcd": ["etcd"]}[role]
    return cl.procs[rng.choice(pool)]


def inject(cl: Cluster, step: Step, rng: random.Random, tick: Callable[[], None]) -> Fault:
    """Run one fault to its end (healed, resumed or restarted)."""
    p = _pick(cl, step.kind, rng)
    action = step.kind.split("-", 1)[0]
    start = time.monotonic()
    if action == "pause":
        p.signal(signal.SIGSTOP)
        p.paused = True
        _sleep(step.hold_s, tick)
        p.signal(signal.SIGCONT)
        p.paused = False
    elif action == "kill":
        p.signal(signal.SIGKILL)
        if p.popen is not None:
            p.popen.wait(10)
        _sleep(step.hold_s, tick)
        cl.start(p)
    else:
        others = [h for h in ["etcd", *cl.masters, *cl.stores, *cl.workers] if h != p.name]
        for h in ["etcd"] if step.kind == "partition-leader-etcd" else others:
            cl.hosts.cut(p.name, h)
        start = time.monotonic()  # from the moment every rule is in place
        _sleep(step.hold_s, tick)
        cl.hosts.heal()
    end = time.monotonic()
    held = end - start  # measured: a tick (the eviction scrape) may overshoot the drawn hold
    dead = p.kind == "store" and (action == "kill" or held >= cl.s.client_ttl_s * 2 / 3)
    wall = time.strftime("%H:%M:%S", time.gmtime(time.time() - (time.monotonic() - start)))
    return Fault(step.kind, p.name, start, end, p.name if dead else "", wall)


def run_faults(cl: Cluster, duration_s: float, seed: int, kinds: list[str],
               max_hold_s: float, say: Callable[[str], None]) -> list[Fault]:  # fmt: skip
    """Inject seeded faults for ``duration_s``; one progress line per fault."""
    rng = random.Random(seed)
    tail = Tail(cl.run)
    faults: list[Fault] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < duration_s:
        step = draw(rng, kinds, max_hold_s)
        f = inject(cl, step, rng, cl.scrape_evictions)
        faults.append(f)
        deadline = f.end + RECOVERY_CAP_S
        while (back := tail.first_answer(f.start)) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        out = f"{back - f.start:.2f} s" if back is not None else f">{RECOVERY_CAP_S:.0f} s"
        dead = f" (counts as dead: {f.node_dead})" if f.node_dead else ""
        say(f"  {f.wall} +{f.start - t0:5.1f} s  {f.kind:22s} {f.target:4s} held {f.end - f.start:5.2f} s  "
            f"first answer after {out}{dead}")  # fmt: skip
        _sleep(step.gap_s, cl.scrape_evictions)
    return faults
