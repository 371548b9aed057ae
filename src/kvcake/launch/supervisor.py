"""Keeps a started cluster's processes running: a child that exits (crash, OOM, ``kill -9``) is
logged with its exit code or signal and started again, with the same argv, config and ports,
after a backoff that doubles with every quick failure (0.5 s, 1 s, 2 s... up to 30 s) and resets
once the child has stayed up for ``stable_s``.

Invariant: the supervisor never restarts a child while the cluster is stopping, and every
restart is counted in ``Child.restarts`` (shown by ``kvcake status``).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kvcake.core.errors import KvcakeError

log = logging.getLogger(__name__)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


@dataclass(frozen=True)
class RestartPolicy:
    base_s: float = 0.5
    max_s: float = 30.0
    stable_s: float = 30.0  # up this long: the next failure starts the backoff over

    def delay(self, failures: int) -> float:
        return float(min(self.max_s, self.base_s * 2 ** max(0, failures - 1)))


@dataclass(kw_only=True)
class RestartState:
    """What the supervisor keeps per child; every child class of a cluster inherits it (the
    launcher's ``Child``, ``VllmChild``, the netns ``Proc``)."""

    started: float = field(default_factory=time.monotonic)  # the last (re)start
    restarts: int = 0
    failures: int = 0  # consecutive quick failures (the backoff)
    restart_at: float | None = None
    last_exit: str = ""


def die_with_parent() -> None:
    """``preexec_fn`` of every supervised child: SIGTERM when the thread that spawned it dies
    (PR_SET_PDEATHSIG survives the exec chain), so a SIGKILLed ``kvcake up`` leaves no process
    behind that nobody supervises. Linux only; elsewhere a no-op."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Supervised(Protocol):
    """What the supervisor needs from a cluster (``launcher.Cluster``)."""

    children: list[Any]
    lock: threading.RLock
    stopping: bool

    def respawn(self, ch: Any) -> None: ...

    def write_state(self) -> None: ...

    def say(self, msg: str) -> None: ...


class Supervisor:
    def __init__(self, cluster: Supervised, policy: RestartPolicy | None = None):
        self.cluster = cluster
        self.policy = policy or RestartPolicy()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> None:
        """One pass: notice exits, restart the children whose backoff has passed."""
        now = time.monotonic()
        with self.cluster.lock:
            if self.cluster.stopping:
                return
            for ch in self.cluster.children:
                self._check_child(ch, now)

    def _check_child(self, ch: Any, now: float) -> None:
        rc = ch.proc.poll() if ch.proc is not None else None
        if rc is None:
            if ch.failures and now - ch.started > self.policy.stable_s:
                ch.failures = 0
            return
        if ch.restart_at is None:  # just noticed
            ch.failures += 1
            ch.last_exit = describe_exit(rc)
            delay = self.policy.delay(ch.failures)
            ch.restart_at = now + delay
            self.cluster.say(
                f"supervisor: {ch.name} (pid {ch.proc.pid}) {ch.last_exit}; restarting in "
                f"{delay:.1f} s (restart #{ch.restarts + 1}, log {ch.log})"
            )
            self.cluster.write_state()
        elif now >= ch.restart_at:
            ch.restart_at = None
            self.cluster.respawn(ch)
            ch.restarts += 1
            self.cluster.say(f"supervisor: {ch.name} restarted (pid {ch.proc.pid})")
            self.cluster.write_state()

    def start(self, interval_s: float = 0.2) -> None:
        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.check()
                except Exception:  # a failed respawn is retried at the next pass
                    log.exception("supervisor pass failed")

        self._thread = threading.Thread(target=loop, name="kvcake-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


class ClusterStartError(KvcakeError):
    """A process of the cluster failed to start; the message says which and why."""


@dataclass
class Child(RestartState):
    """One supervised process of a cluster (its restart state, argv, log and what its ready
    line said)."""

    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    info: dict[str, str] = field(default_factory=dict)  # what its ready line said (addresses)
    start_ticks: int = 0  # /proc start time of ``proc``: `kvcake down` checks it before signalling
