"""Thread pools that start all their workers up front.

``ThreadPoolExecutor`` creates a worker only when a task finds no idle one, so a process's
thread count creeps up to the bound over hours of uneven load. That is bounded, but it makes a
leak check (threads flat over a soak) unreadable. A pool from :func:`started_pool` has its
``workers`` threads from the first moment, so any later growth is a real leak.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait


def started_pool(workers: int, prefix: str) -> ThreadPoolExecutor:
    """A ``ThreadPoolExecutor(workers)`` whose ``workers`` threads are all running on return."""
    if workers < 1:
        raise ValueError(f"a pool needs at least one worker, got {workers}")
    pool = ThreadPoolExecutor(workers, thread_name_prefix=prefix)
    # Every task waits for all the others, so no worker is idle when the next task is
    # submitted and the executor must start a new thread for each.
    gate = threading.Barrier(workers)
    wait([pool.submit(gate.wait) for _ in range(workers)])
    return pool
