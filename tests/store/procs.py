"""Spawning real ``kvcake master`` / ``kvcake store-server`` processes for integration tests."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kvcake.core.errors import KvcakeError
from kvcake.core.ports import free_port


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    info: dict[str, str]
    lines: list[str] = field(default_factory=list)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(5)


def spawn(
    command: str,
    *flags: str,
    ready: str,
    timeout: float = 30,
    wrap: Callable[[list[str]], list[str]] | None = None,
    env: dict[str, str] | None = None,
) -> Proc:
    """Start ``python -m kvcake <command> <flags>`` and wait for its ready line (``key=value``
    pairs after the word ``ready``). ``wrap``: the command as run elsewhere (an emulated
    host's ``Network.command``); ``env``: added to the environment."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    argv = [sys.executable, "-m", "kvcake", command, *flags]
    popen = subprocess.Popen(
        wrap(argv) if wrap is not None else argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    proc = Proc(popen, {})
    got = threading.Event()

    def pump() -> None:
        assert popen.stdout is not None
        for line in popen.stdout:
            proc.lines.append(line)
            if line.startswith(ready) and not got.is_set():
                proc.info = dict(re.findall(r"(\w+)=(\S*)", line))
                got.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while not got.wait(0.05) and reader.is_alive() and time.monotonic() < deadline:
        pass  # (a process that exited without its line is reported at once, not at timeout)
    if not got.is_set():
        with contextlib.suppress(ProcessLookupError):
            popen.kill()
        popen.wait(5)
        raise RuntimeError(f"{command} did not start:\n{''.join(proc.lines)}")
    return proc


@contextlib.contextmanager
def pool(segment: str = "64MiB", *master_flags: str) -> Iterator[str]:
    """A master and one store-server with ``segment`` of memory, stopped on exit; yields the
    master's ``host:port``."""
    port = free_port()
    addr = f"127.0.0.1:{port}"
    procs: list[Proc] = []
    try:
        procs.append(
            spawn("master", "--port", str(port), "--http-port", "-1", *master_flags, ready="master")
        )
        procs.append(
            spawn("store-server", "--master", addr, "--segment-size", segment, ready="store-server")
        )
        yield addr
    finally:
        for p in reversed(procs):
            p.stop()


def unreadable(client: Any, values: dict[str, bytes]) -> list[str]:
    """The keys of ``values`` that ``client`` cannot read back exactly, each with why."""
    lost = []
    for k, v in values.items():
        try:
            if bytes(client.get(k)) != v:
                lost.append(f"{k}: wrong bytes")
        except KvcakeError as exc:
            lost.append(f"{k}: {type(exc).__name__}: {exc}")
    return lost
