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
import threading
import time
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from kvcake.core.backoff import backoff_s
from kvcake.launch.child import Child

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
        return backoff_s(failures, self.base_s, self.max_s)


C = TypeVar("C", bound=Child)


class Supervised(Protocol[C]):
    """What the supervisor needs from a cluster (``launcher.Cluster``, ``NetnsCluster``,
    ``VllmCluster``); its children are :class:`kvcake.launch.child.Child` objects."""

    children: list[C]
    lock: threading.RLock
    stopping: bool

    def respawn(self, ch: C) -> None: ...

    def write_state(self) -> None: ...

    def say(self, msg: str) -> None: ...


class Supervisor(Generic[C]):
    def __init__(self, cluster: Supervised[C], policy: RestartPolicy | None = None):
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

    def _check_child(self, ch: C, now: float) -> None:
        if ch.proc is None:
            return
        pid, rc = ch.proc.pid, ch.proc.poll()
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
                f"supervisor: {ch.name} (pid {pid}) {ch.last_exit}; restarting in "
                f"{delay:.1f} s (restart #{ch.restarts + 1}, log {ch.log})"
            )
            self.cluster.write_state()
        elif now >= ch.restart_at:
            ch.restart_at = None
            self.cluster.respawn(ch)
            ch.restarts += 1
            pid = ch.proc.pid if ch.proc is not None else 0
            self.cluster.say(f"supervisor: {ch.name} restarted (pid {pid})")
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
