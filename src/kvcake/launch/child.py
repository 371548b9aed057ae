"""One process of a cluster, written once for every kind of cluster: ``kvcake up``'s local
cluster (:mod:`.launcher`, with its HA pool :mod:`.ha_pool`), the emulated multi-host one
(:mod:`.netns_cluster`), the vLLM fleet (:mod:`kvcake.fleet.cluster`) and LMCache's MP server
(:mod:`kvcake.fleet.lmcache_mp`).

A :class:`Child` starts its command with its output in its own log file, in a session of its
own and with :func:`die_with_parent`; waits for a ready line in that log (the addresses it
bound) or for an HTTP check to answer 200; pins the ports it got into its argv so a restart
comes back at the same address; and stops with SIGTERM, then SIGKILL after a grace period
(:func:`stop_tiers` does that tier by tier for a whole cluster). It also carries what
:class:`kvcake.launch.supervisor.Supervisor` keeps per child (restarts, backoff).

Invariant: a wait fails as soon as the process exits, with the tail of its log in the error.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Self

import httpx

from kvcake.core.errors import KvcakeError
from kvcake.launch.runstate import proc_start_ticks


class ClusterStartError(KvcakeError):
    """A process of the cluster failed to start; the message says which and why."""


def die_with_parent() -> None:
    """``preexec_fn`` of every supervised child: SIGTERM when the thread that spawned it dies
    (PR_SET_PDEATHSIG survives the exec chain), so a SIGKILLed ``kvcake up`` leaves no process
    behind that nobody supervises. Linux only; elsewhere a no-op."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    """One supervised process: its command, log, what its ready line said and its restart
    state. ``env`` None runs it with this process's environment; ``group`` makes signals
    reach its whole process group (a vLLM engine's API server, engine core and worker)."""

    TAIL: ClassVar[int] = 8  # lines of its log a start error shows

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] | None = None
    group: bool = False
    error: type[KvcakeError] = ClusterStartError  # what a failed wait raises
    proc: subprocess.Popen[bytes] | None = None
    info: dict[str, str] = field(default_factory=dict)  # what its ready line said (addresses)
    start_ticks: int = 0  # /proc start time of ``proc``: `kvcake down` checks it before signalling
    log_from: int = 0  # where the current run's output starts in ``log`` (a restart appends)
    # What the supervisor keeps (kvcake.launch.supervisor):
    started: float = field(default_factory=time.monotonic)  # the last (re)start
    restarts: int = 0
    failures: int = 0  # consecutive quick failures (the backoff)
    restart_at: float | None = None
    last_exit: str = ""

    # --- start -------------------------------------------------------------------------------
    def command(self) -> list[str]:
        """What is executed (a subclass may wrap ``argv``, e.g. to run it on an emulated host)."""
        return self.argv

    def spawn(self, append: bool = False) -> Self:
        """Start the process; ``append`` (a restart) keeps the earlier runs' output in the log."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab" if append else "wb") as fh:
            if append:
                fh.write(
                    f"\n--- restart #{self.restarts + 1} after: {self.last_exit} ---\n".encode()
                )
            fh.flush()
            self.log_from = fh.tell()
            env = dict(os.environ if self.env is None else self.env, PYTHONUNBUFFERED="1")
            self.proc = subprocess.Popen(self.command(), stdout=fh, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True,
                                         preexec_fn=die_with_parent)  # fmt: skip
        self.started = time.monotonic()
        self.start_ticks = proc_start_ticks(self.proc.pid)
        return self

    def pin(self, values: dict[str, str]) -> None:
        """Set each flag's value in ``argv`` (added when absent): a restarted process must come
        back on the port its peers already know (the first start may have asked for port 0)."""
        out = list(self.argv)
        for flag, v in values.items():
            if flag in out:
                out[out.index(flag) + 1] = v
            else:
                out += [flag, v]
        self.argv = out

    # --- its log -----------------------------------------------------------------------------
    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def describe(self) -> str:
        return self.name

    def failure(self, what: str) -> str:
        tail = self.log_text().strip().splitlines()[-self.TAIL :]
        return f"{self.describe()} {what} (log {self.log}):\n    " + "\n    ".join(tail)

    # --- waits -------------------------------------------------------------------------------
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise self.error(self.failure(f"exited with {self.proc.returncode}"))

    def wait_until(
        self, ok: Callable[[], bool], timeout_s: float, what: Callable[[], str],
        interval_s: float = 0.05,
    ) -> None:  # fmt: skip
        """Poll ``ok`` until it holds; raise ``error`` (with ``what()``) when the process exits
        first or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while not ok():
            self.check_alive()
            if time.monotonic() >= deadline:
                raise self.error(self.failure(what()))
            time.sleep(interval_s)

    def wait_line(self, pattern: str, timeout_s: float) -> dict[str, str]:
        """Wait for ``pattern`` in the current run's output; its named groups go into ``info``."""
        rx = re.compile(pattern)

        def seen() -> bool:
            try:
                with self.log.open("rb") as fh:
                    fh.seek(self.log_from)
                    m = rx.search(fh.read().decode(errors="replace"))
            except OSError:
                return False
            if m:
                self.info.update({k: v for k, v in m.groupdict().items() if v is not None})
            return m is not None

        self.wait_until(seen, timeout_s, lambda: "did not become ready in time")
        return self.info

    def wait_http(self, url: str, timeout_s: float, interval_s: float = 0.1) -> None:
        """Wait until ``GET url`` answers 200 (a health check)."""
        why = ""

        def ok() -> bool:
            nonlocal why
            try:
                r = httpx.get(url, timeout=2)
            except httpx.HTTPError as exc:
                why = repr(exc)
                return False
            why = r.text[:500]
            return r.status_code == 200

        self.wait_until(ok, timeout_s, lambda: f"never became ready ({why})", interval_s)

    # --- stop --------------------------------------------------------------------------------
    def signal(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)

    def terminate(self) -> None:
        if self.alive():
            self.signal(signal.SIGTERM)

    def reap(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the process to exit, then SIGKILL it (a group: whatever
        of it is left, always)."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
        if self.group:
            self.signal(signal.SIGKILL)  # stragglers of the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)

    def stop(self, grace_s: float = 10.0) -> None:
        self.terminate()
        self.reap(grace_s)


def stop_tiers(tiers: Iterable[Iterable[Child]], grace_s: float) -> None:
    """SIGTERM the children tier by tier (each tier gets ``grace_s`` to exit, then SIGKILL), so
    nobody loses a peer it still needs while shutting down."""
    for tier in tiers:
        group = list(tier)
        for ch in group:
            ch.terminate()
        deadline = time.monotonic() + grace_s
        for ch in group:
            ch.reap(max(0.1, deadline - time.monotonic()))
