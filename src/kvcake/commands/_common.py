"""Helpers shared by sub-command modules (the leading underscore keeps :mod:`kvcake.cli` from
registering this module as a command)."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from typing import Any, Protocol


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


def add_program(sub: Any, name: str, target: str, help: str, description: str,
                preface: bool = False) -> None:  # fmt: skip
    """Register ``kvcake NAME`` for a process whose module parses its own command line:
    ``target`` (``module:function``, imported only when the command runs, so ``kvcake --help``
    stays fast) is called with every argument after NAME, ``--help`` included, so one parser
    (the module's) answers both ``kvcake NAME --help`` and the process's own flags. ``preface``:
    print ``description`` before the program's help (Mooncake's gflags programs, whose help
    lists flags only)."""
    p = sub.add_parser(
        name, help=help, description=description, add_help=False, prefix_chars="\0"
    )  # fmt: skip  (no option of ours: all go to the program)
    p.add_argument("argv", nargs=argparse.REMAINDER, help="the program's own flags")
    p.set_defaults(func=lambda args: _run_program(name, target, args.argv, description, preface))


def _run_program(name: str, target: str, argv: list[str], description: str, preface: bool) -> int:
    if preface and any(a.lstrip("-") in ("help", "helpfull", "h") for a in argv):
        print(f"{description}\n", flush=True)
    sys.argv = [f"kvcake {name}", *argv]  # argparse's default prog: usage reads `kvcake NAME`
    module, _, func = target.partition(":")
    return int(getattr(importlib.import_module(module), func)(argv) or 0)
