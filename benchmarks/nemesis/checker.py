"""The nemesis's checker: pure functions over recorded histories (no processes, no clock).

A history is a list of :class:`Op`: one client call with its invoke and completion times (one
system-wide monotonic clock, shared by every process here), its outcome and, for reads, what
each key returned (:class:`values.Seen` as ``[key, version, intact]``, ``None`` = not found,
a string = an error for that key). Outcomes, as in Jepsen: ``ok`` (acknowledged; a read
answered), ``fail`` (definitely not applied: the master refused it), ``info`` (unknown: an
error or a timeout, or the client died first). One assumption beyond Jepsen's: an unknown call
whose client saw it end (an error) took effect between its invoke and that end or not at all
(the client sends no retry after it returns, and a master without its lease applies nothing),
so only a call whose client died first may take effect at any later time. A remove answered
"not found" is unknown, not refused: its first try may have been applied by a leader that
died before replying, and the retry then finds the key gone (docs/store.md, "Clients").

(a) :func:`wrong_reads`: every intact read of key k returned an ok or unknown write of k that
was invoked before the read completed and not superseded: no ok mutation of k (put, upsert,
remove) that began after that write had completed and itself completed before the read began.
Torn bytes, another key's bytes, a version nobody wrote or whose write failed: all wrong.
(b) :func:`lost_objects`: at the end every key holds one of its possible final states (the last
ok mutation, or any unknown mutation's effect); a key missing or holding an older version is
lost unless every node holding a replica of its last acknowledged write was dead since then.
(c) :func:`outages`: per fault, the time from its injection to the first answered call invoked
after it.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WRITES = ("put", "upsert")
MUTATIONS = ("put", "upsert", "remove")
READS = ("get", "batch_get")
ABSENT = ""  # the "version" of a key that is not there


@dataclass
class Op:
    proc: str
    f: str  # put | upsert | remove | get | batch_get
    keys: tuple[str, ...]
    invoke: float
    complete: float = math.inf  # inf: never completed (its process died)
    outcome: str = "info"
    version: str = ""  # what a put/upsert wrote
    reads: list[Any] = field(default_factory=list)  # per key: [key, ver, intact] | None | str
    place: list[str] | None = None  # nodes holding the write's replicas (None: unknown)
    err: str = ""

    @property
    def key(self) -> str:
        return self.keys[0]


@dataclass
class Fault:
    kind: str  # e.g. "pause-leader", "kill-store", "partition-leader-etcd"
    target: str  # the host role (m0, s1, c2, etcd)
    start: float
    end: float  # healed / resumed / restarted
    node_dead: str = ""  # a storage node that counts as dead over [start, end] ("" = none)
    wall: str = ""  # UTC time of the injection (to find it in the processes' logs)


@dataclass
class Problem:
    kind: str  # torn | other-key | unknown-version | future | stale | lost | wrong-final
    key: str
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "key": self.key, "detail": self.detail}


# --- loading ------------------------------------------------------------------------------------
def load_history(paths: Iterable[Path]) -> list[Op]:
    """Ops from the workers' JSON-lines files (an invoke line, then at most one completion)."""
    ops: list[Op] = []
    for path in paths:
        pending: dict[int, Op] = {}
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut by SIGKILL
            if rec["type"] == "invoke":
                op = Op(rec["p"], rec["f"], tuple(rec["k"]), rec["t"], version=rec.get("v", ""))
                pending[rec["i"]] = op
                ops.append(op)
            elif (op := pending.pop(rec["i"], None)) is not None:
                op.complete, op.outcome = rec["t"], rec["type"]
                op.reads, op.place, op.err = (
                    rec.get("read", []),
                    rec.get("place"),
                    rec.get("err", ""),
                )
                if op.f == "remove" and op.err.startswith("ObjectNotFound"):
                    op.outcome = "info"  # maybe applied by a leader that died (docstring)
    return ops


def by_key(ops: list[Op]) -> dict[str, list[Op]]:
    """Each key's mutations, in invoke order."""
    out: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        if op.f in MUTATIONS:
            out[op.key].append(op)
    for muts in out.values():
        muts.sort(key=lambda o: o.invoke)
    return out


# --- (a) ----------------------------------------------------------------------------------------
def wrong_reads(ops: list[Op]) -> list[Problem]:
    muts = by_key(ops)
    writes = {(o.key, o.version): o for ms in muts.values() for o in ms if o.f in WRITES}
    problems = []
    for op in ops:
        if op.f not in READS or op.outcome != "ok":
            continue
        for key, got in zip(op.keys, op.reads, strict=False):
            if isinstance(got, list):
                p = _check_read(op, key, got, writes, muts.get(key, []))
                if p is not None:
                    problems.append(p)
    return problems


def _check_read(
    op: Op, key: str, got: list[Any], writes: dict[tuple[str, str], Op], muts: list[Op]
) -> Problem | None:
    seen_key, version, intact = got
    where = f"{op.f} by {op.proc} [{op.invoke:.3f}, {op.complete:.3f}]"
    if not intact:
        return Problem("torn", key, f"{where}: bytes fail their digest (header {seen_key!r})")
    if seen_key != key:
        return Problem("other-key", key, f"{where}: returned {seen_key!r} {version}")
    w = writes.get((key, version))
    if w is None or w.outcome == "fail":
        return Problem("unknown-version", key, f"{where}: {version} was never written")
    if w.invoke > op.complete:
        return Problem("future", key, f"{where}: {version} was written only at {w.invoke:.3f}")
    for m in muts:
        if m.outcome == "ok" and w.complete < m.invoke and m.complete < op.invoke:
            return Problem(
                "stale", key,
                f"{where}: {version} (acked {w.complete:.3f}) was superseded by {m.f} "
                f"{m.version or ''} acked at {m.complete:.3f}, before the read began",
            )  # fmt: skip
    return None


# --- (b) during the run ---------------------------------------------------------------------------
def vanished_reads(ops: list[Op], faults: list[Fault], nodes: list[str]) -> list[Problem]:
    """Reads that found no object although one was acknowledged before they began and nothing
    could have removed it meanwhile: no remove or upsert (ok or unknown) that may fall after
    that write, and not every node holding it dead since. Either a stale answer or a lost
    object; a lost object later rewritten would escape the final check."""
    muts = by_key(ops)
    problems = []
    for op in ops:
        if op.f not in READS or op.outcome != "ok":
            continue
        for key, got in zip(op.keys, op.reads, strict=False):
            if got is None and not _absent_possible(op, muts.get(key, []), faults, nodes):
                problems.append(Problem(
                    "vanished", key, f"{op.f} by {op.proc} [{op.invoke:.3f}, {op.complete:.3f}] "
                    "found nothing; an acknowledged write was there and nothing removed it",
                ))  # fmt: skip
    return problems


def _absent_possible(op: Op, muts: list[Op], faults: list[Fault], nodes: list[str]) -> bool:
    done = [m for m in muts if m.outcome == "ok" and m.complete < op.invoke]
    if not done:
        return True
    last = max(done, key=lambda m: m.complete)
    if last.f == "remove":
        return True
    for m in muts:
        if m is last or m.f == "put" or m.outcome == "fail" or m.invoke > op.complete:
            continue
        if m.complete >= last.invoke:  # may fall after the last acknowledged write
            return True
    return _excused(last, faults, nodes)


# --- (b) ----------------------------------------------------------------------------------------
def possible_finals(muts: list[Op]) -> tuple[set[str], Op | None]:
    """The states a key may end in (versions; ABSENT) and its last acknowledged mutation."""
    oks = [m for m in muts if m.outcome == "ok"]
    last = max(oks, key=lambda m: m.complete) if oks else None
    finals = {ABSENT if last is None or last.f == "remove" else last.version}
    for m in muts:
        if m.outcome == "info" and (last is None or m.complete > last.invoke):  # may be last
            finals.add(ABSENT if m.f == "remove" else m.version)
            if m.f == "upsert":  # an upsert makes its key invisible while it rewrites
                finals.add(ABSENT)
    return finals, last


def _excused(w: Op, faults: list[Fault], nodes: list[str]) -> bool:
    """Every node that held a replica of ``w`` was dead at some time since ``w`` began (a node
    whose placement is unknown may be any storage node, so one death excuses it)."""
    dead = {f.node_dead for f in faults if f.node_dead and f.end >= w.invoke}
    if w.place is None:
        return bool(dead & set(nodes))
    return bool(w.place) and set(w.place) <= dead


def lost_objects(
    ops: list[Op], final: dict[str, Any], faults: list[Fault], nodes: list[str]
) -> tuple[list[Problem], int]:
    """``final``: key -> what the last read returned ([key, ver, intact] | None | error str).
    Returns the problems and how many losses the deaths of nodes excused."""
    muts = by_key(ops)
    problems, excused = [], 0
    for key in sorted(set(final) | set(muts)):
        finals, last = possible_finals(muts.get(key, []))
        got = final.get(key, "never read at the end")
        if isinstance(got, list) and got[2] and got[0] == key and got[1] in finals:
            continue
        if got is None and ABSENT in finals:
            continue
        if isinstance(got, list) and not (got[2] and got[0] == key):
            problems.append(Problem("wrong-final", key, f"final read returned {got}"))
            continue
        if last is not None and last.f in WRITES and _excused(last, faults, nodes):
            excused += 1
            continue
        what = "missing" if got is None else f"returned {got}"
        expect = sorted(v or "absent" for v in finals)
        problems.append(Problem("lost", key, f"final read {what}; expected one of {expect}"))
    return problems, excused


# --- (c) ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outage:
    first: float | None  # injection -> first answer to a call invoked after it (None: none)
    gap: float  # the longest time without any answer between the injection and the next fault


def outages(ops: list[Op], faults: list[Fault], end: float) -> list[Outage]:
    """Per fault: how long calls went unanswered. An answer is an ok or refused (``fail``)
    completion. ``first`` ignores calls already waiting at the injection; ``gap`` counts every
    answer and also covers a fault whose effect comes late (a leader that steps down ~1.6 s
    into an etcd pause)."""
    answered = sorted((o.complete, o.invoke) for o in ops if o.outcome in ("ok", "fail"))
    done = [c for c, _ in answered]
    out = []
    for n, f in enumerate(faults):
        until = faults[n + 1].start if n + 1 < len(faults) else end
        first = min((c for c, i in answered if i >= f.start and c <= end), default=None)
        marks = [f.start, *(c for c in done if f.start <= c <= until), until]
        gap = max(b - a for a, b in itertools.pairwise(marks))
        out.append(Outage(None if first is None else first - f.start, gap))
    return out
