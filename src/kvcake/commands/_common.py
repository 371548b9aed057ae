"""Helpers shared by sub-command modules (the leading underscore keeps :mod:`kvcake.cli` from
registering this module as a command)."""

from __future__ import annotations

import signal
import threading


def wait_for_signal(poll_s: float = 0.05) -> None:
    """Block the main thread until SIGTERM or SIGINT. The handler only sets an event; the wait
    wakes every ``poll_s`` to notice it (short by default: SIGTERM should stop us promptly)."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(poll_s):
        pass
