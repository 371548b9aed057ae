"""Helpers shared by sub-command modules (the leading underscore keeps :mod:`kvcake.cli` from
registering this module as a command)."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Protocol


def wait_for_signal(poll_s: float = 0.05) -> None:
    """Block the main thread until SIGTERM or SIGINT. The handler only sets an event; the wait
    wakes every ``poll_s`` to notice it (short by default: SIGTERM should stop us promptly)."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(poll_s):
        pass


class _Server(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


def serve_until_signal(server: _Server, name: str, ready: object) -> int:
    """Start ``server``, print its ready line (``ready()`` when callable: bound ports are known only
    after start), serve until SIGTERM/SIGINT, stop. A port that cannot be bound exits with 2."""
    try:
        server.start()
    except OSError as exc:
        print(f"kvcake {name}: cannot listen: {exc}", file=sys.stderr)
        server.stop()
        return 2
    print(ready() if callable(ready) else ready, flush=True)
    try:
        wait_for_signal()
    finally:
        server.stop()
    return 0
