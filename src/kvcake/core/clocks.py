"""The one suspend-aware clock every lease and deadline in kvcake is measured on."""

from __future__ import annotations

import time


def boottime() -> float:
    """Seconds on ``CLOCK_BOOTTIME``: unlike ``CLOCK_MONOTONIC`` it also counts the time the
    host was suspended, and like it the time a process was stopped, so a process that wakes
    from a pause or a VM freeze finds its leases and deadlines passed."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)
