"""A large copy in two halves, the second on one helper thread while that thread is idle.

Why: a streamed copy of 16 MiB is bound by one core (0.76-0.82 ms here), a copy that also sums
its pieces by that core's hashing as well (0.89-0.94 ms); in two halves on two cores both take
0.67-0.70 ms, so the sums cost nothing where memory, not the core, is the bound
(docs/benchmarks.md, "Integrity cost", twenty-fourth session). Plain and summing copies are
split alike, so what the sums cost is still compared like with like.

Bounds: one helper thread per process, one half in flight. A caller that finds it busy (another
thread's half) copies all of its value itself rather than queue behind it, so concurrent
callers never wait for each other here. The caller waits for its half before it returns, so
the memory both halves touch outlives the helper's use of it. ``KVCAKE_SPLIT=0`` turns the
split off (to compare); a process with one CPU never splits.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# From here up a copy is split. Below it the hand-over (~50 us: Python and a thread wake-up)
# costs more than the second core saves: 4 MiB copies took 0.24-0.25 ms split, 0.18-0.20 whole.
SPLIT_MIN = 8 << 20


def _enabled() -> bool:
    if os.environ.get("KVCAKE_SPLIT", "1") == "0":
        return False
    try:
        return len(os.sched_getaffinity(0)) >= 2
    except (AttributeError, OSError):
        return (os.cpu_count() or 1) >= 2


class Helper:
    """The one helper thread (started on first use, forgotten in a forked child)."""

    def __init__(self) -> None:
        self.enabled = _enabled()
        self._reset()

    def _reset(self) -> None:
        self._busy = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.splits = 0  # halves handed to the helper (a test's proof that it ran)

    def submit(self, fn: Callable[[], T]) -> Future[T] | None:
        """Run ``fn`` on the helper, or None when it is busy or splitting is off."""
        if not self.enabled or not self._busy.acquire(blocking=False):
            return None
        try:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvcake-half")
            fut = self._pool.submit(fn)
            self.splits += 1
        except BaseException:
            self._busy.release()
            raise
        fut.add_done_callback(lambda _: self._busy.release())
        return fut


HELPER = Helper()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=HELPER._reset)


def in_halves(first: Callable[[], T], second: Callable[[], T]) -> tuple[T, T] | None:
    """``(first(), second())`` with ``second`` on the helper; None (nothing run) when the
    helper is busy. The helper's half is waited for even when ``first`` raises."""
    fut = HELPER.submit(second)
    if fut is None:
        return None
    try:
        a = first()
    finally:
        b = fut.result()
    return a, b
