"""Continuous batching without one event per token.

Between two changes of batch membership, iteration ``k`` of an epoch takes
``a + b*k`` seconds: ``a = d0 + d1*B + d2*ctx`` from the cost model's decode-time model and
``b = d2*B`` because every iteration adds one token of context per sequence. So the time of
``n`` iterations is ``n*a + b*n*(n-1)/2`` and every token time follows arithmetically. An epoch
ends at the iteration boundary where a member finishes or where a waiting request can join
(joins happen only at iteration boundaries, as in real continuous batching).

Invariants: ``members`` run in the current epoch that started at ``t0``; ``pending`` joins at
the next boundary; exactly one boundary event is live (older ones carry a stale ``version``).
The owner (a decode instance) accounts KV memory; this class only models time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from kvcake.core.costmodel import DecodeCoefficients
from kvcake.sim.events import EventQueue, Prio
from kvcake.sim.request import SimRequest

FinishFn = Callable[[float, SimRequest], None]


class DecodeBatch:
    __slots__ = (
        "_a",
        "_b",
        "_ctx0",
        "_sched",
        "_version",
        "coeffs",
        "epochs",
        "eq",
        "extra",
        "members",
        "on_finish",
        "pending",
        "t0",
    )

    def __init__(self, eq: EventQueue, coeffs: DecodeCoefficients, on_finish: FinishFn) -> None:
        self.eq = eq
        self.coeffs = coeffs
        self.on_finish = on_finish
        self.members: list[SimRequest] = []
        self.pending: list[SimRequest] = []
        self.t0 = 0.0
        self._a = 0.0
        self._b = 0.0
        self._ctx0 = 0
        self._sched = 0  # iterations until the scheduled boundary
        self._version = 0
        self.epochs = 0
        # per-iteration extra cost ``(a, b)`` added by a subclass (e.g. a prefill chunk)
        self.extra = (0.0, 0.0)

    # --- arithmetic -------------------------------------------------------------------------

    def _time_of(self, n: int) -> float:
        return n * self._a + self._b * n * (n - 1) / 2.0

    def steps_done(self, now: float) -> int:
        """Iterations of the current epoch completed by ``now``."""
        dt = now - self.t0
        if not self.members or dt <= 0:
            return 0
        a, b = self._a, self._b
        if b > 0:
            h = a - b / 2.0
            n = int((-h + math.sqrt(h * h + 2.0 * b * dt)) / b)
        else:
            n = int(dt / a)
        while self._time_of(n + 1) <= dt:
            n += 1
        while n > 0 and self._time_of(n) > dt:
            n -= 1
        return min(n, self._sched)

    def context_tokens(self, now: float) -> int:
        return self._ctx0 + len(self.members) * self.steps_done(now)

    def context_with_pending(self, now: float) -> int:
        """Context tokens of the running batch plus those joining at the next boundary."""
        ctx = self._ctx0 + len(self.members) * self.steps_done(now) if self.members else 0
        if self.pending:
            ctx += sum(r.ctx for r in self.pending)
        return ctx

    @property
    def size(self) -> int:
        return len(self.members) + len(self.pending)

    def step_time(self, now: float) -> float:
        """Current iteration time (what a TBT predictor would see)."""
        if not self.members:
            return 0.0
        return self.coeffs.time(len(self.members), self.context_tokens(now))

    # --- membership -------------------------------------------------------------------------

    def add(self, now: float, req: SimRequest) -> None:
        """``req`` (whose first token was emitted at ``req.last_tok``) joins at the next
        iteration boundary."""
        self.pending.append(req)
        if not self.members:
            self._boundary_now(now)
        else:
            self.interrupt(now)

    def interrupt(self, now: float) -> None:
        """End the running epoch at the next iteration boundary (no-op when idle)."""
        if not self.members:
            return
        dt = now - self.t0
        n = self.steps_done(now)
        target = n if self._time_of(n) >= dt else n + 1
        if target < self._sched:
            self._schedule(target)

    def _boundary_now(self, now: float) -> None:
        self._version += 1
        self._sched = 0
        self.eq.schedule(now, Prio.BATCH, self._on_boundary, (self._version, 0))

    def _schedule(self, steps: int) -> None:
        self._version += 1
        self._sched = steps
        self.eq.schedule(
            self.t0 + self._time_of(steps), Prio.BATCH, self._on_boundary, (self._version, steps)
        )

    def _on_boundary(self, now: float, payload: tuple[int, int]) -> None:
        version, n = payload
        if version != self._version:
            return
        if n:
            self._advance(n)
        if self.epoch_end(now, n):
            self.start_epoch(now)

    def _advance(self, n: int) -> None:
        t0, a, b = self.t0, self._a, self._b
        end = t0 + self._time_of(n)
        keep: list[SimRequest] = []
        done: list[SimRequest] = []
        for m in self.members:
            m.gaps.append((1, t0 - m.last_tok + a, 0.0))
            if n > 1:
                m.gaps.append((n - 1, a + b, b))
            m.last_tok = end
            m.remaining -= n
            m.ctx += n
            (done if m.remaining <= 0 else keep).append(m)
        self.members = keep
        # the epoch is consumed: until a new one starts, nothing more is in flight
        self.t0, self._sched = end, 0
        self._ctx0 = sum(m.ctx for m in keep)
        for m in done:
            m.finish = end
            self.on_finish(end, m)

    # --- hooks for subclasses ---------------------------------------------------------------

    def epoch_end(self, now: float, steps: int) -> bool:
        """Called at every boundary (``steps`` iterations after the epoch began) once finished
        members left; returns whether to start the next decode epoch now. Subclasses override
        it to run prefills in between (colocated instances)."""
        return True

    def start_epoch(self, now: float, max_steps: int | None = None) -> None:
        self.members.extend(self.pending)
        self.pending = []
        self._version += 1
        if not self.members:
            self._sched = 0
            return
        self.epochs += 1
        self.t0 = now
        bsz = len(self.members)
        self._ctx0 = sum(m.ctx for m in self.members)
        c = self.coeffs
        ea, eb = self.extra
        self._a = c.d0 + c.d1 * bsz + c.d2 * self._ctx0 + ea
        self._b = c.d2 * bsz + eb
        steps = min(m.remaining for m in self.members)
        if max_steps is not None:
            steps = min(steps, max_steps)
        self._schedule(max(steps, 1))
