"""Fixtures: a directory service, engines and transfer-server processes, all cleaned up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvcake.transfer import DirectoryService, TransferConfig, TransferEngine

PY = sys.executable


@pytest.fixture
def directory() -> Iterator[DirectoryService]:
    svc = DirectoryService("127.0.0.1", 0)
    svc.start()
    yield svc
    svc.stop()


EngineFactory = Callable[..., TransferEngine]


@pytest.fixture
def make_engine(directory: DirectoryService) -> Iterator[EngineFactory]:
    engines: list[TransferEngine] = []

    def make(**kw: Any) -> TransferEngine:
        cfg = kw.pop("config", None) or TransferConfig(io_timeout_s=5.0, probe_interval_s=0.05)
        e = TransferEngine(directory.address, config=cfg, **kw)
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.close()


class ServerProc:
    """A ``kvcake transfer-server`` child process."""

    def __init__(self, args: list[str], prefix: list[str] | None = None):
        cmd = [*(prefix or []), PY, "-m", "kvcake", "transfer-server", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.proc.kill()
            raise RuntimeError(f"transfer-server did not start: {err}")
        self.info: dict[str, Any] = json.loads(line)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            if f:
                f.close()
        return self.proc.returncode


@pytest.fixture
def server_proc() -> Iterator[Callable[..., ServerProc]]:
    procs: list[ServerProc] = []

    def start(*args: str, prefix: list[str] | None = None) -> ServerProc:
        p = ServerProc(list(args), prefix)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


def pattern(n: int, seed: int) -> bytearray:
    """Deterministic pseudo-random bytes."""
    import numpy as np

    return bytearray(np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes())


def no_leftover_shm(pid: int) -> bool:
    return not [f for f in os.listdir("/dev/shm") if f.startswith(f"kvcake-seg-{pid}-")]
