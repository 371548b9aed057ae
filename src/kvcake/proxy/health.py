"""The proxy's health: liveness and readiness apart, as Kubernetes expects.

* **Live** (``/health/live``): this process answers. Never depends on a peer, so a dead master
  or instance never gets the proxy restarted (which would fix nothing).
* **Ready** (``/health/ready``, and ``/health``): from *active* checks, run once per second in
  the background, each naming what failed:

  - ``instances``: a prefill and a decode instance are connected;
  - ``peers``: every instance answered a poll within the last ``PEER_FRESH_S`` (5 s);
  - ``master``: the store master answers a heartbeat (when the cluster has a store);
  - ``directory``: the master's Transfer Engine directory lists every instance's KV segment
    ``kv/<id>`` (without it, prefill cannot write into a decode instance: every request 503s).

  The share of failed requests over the last minute is shown (a reason, and the gauge
  ``kvcake_proxy_recent_request_failure_ratio``) but is not an input: failures follow from a broken
  component, which the checks name; a client sending bad requests must not make us unready.

``kvcake status``, ``kvcake top`` and the dashboard show :meth:`Health.report` (through
``/v1/cluster`` and the dashboard snapshot), so they all say the same thing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

from kvcake.core.api import Role, segment_of
from kvcake.store import protocol as P
from kvcake.store.ha.resolve import connect
from kvcake.transfer.errors import TransferError
from kvcake.transfer.metadata import DirectoryClient

log = logging.getLogger(__name__)

PEER_FRESH_S = 5.0  # a peer not heard from for longer fails the `peers` check
CHECK_EVERY_S = 1.0
STALE_S = 5.0  # checks older than this (the checker stalled) do not count as passing
FAILURE_WINDOW_S = 60.0


class Health:
    def __init__(self, st: Any):
        self.st = st  # proxy_app.ProxyState
        self.checks: dict[str, tuple[bool, str]] = {}  # name -> (ok, detail)
        self.checked_at = 0.0  # time.monotonic() of the last round
        self._outcomes: deque[tuple[float, bool]] = deque(maxlen=10_000)
        self._conn: Any = None  # the master connection (store.ha.resolve.connect)
        self._directory: Any = None  # a transfer DirectoryClient, or None

    # --- request outcomes (shown, not an input) -----------------------------------------------
    def record(self, ok: bool) -> None:
        self._outcomes.append((time.monotonic(), ok))

    def failure_ratio(self) -> tuple[int, int]:
        """(failed, total) requests of the last ``FAILURE_WINDOW_S``."""
        since = time.monotonic() - FAILURE_WINDOW_S
        recent = [ok for t, ok in list(self._outcomes) if t >= since]
        return sum(1 for ok in recent if not ok), len(recent)

    # --- checks -------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.check_once()
            except Exception:  # a bug in one round must not end the checker
                log.exception("health check round failed")
            # Faster until the first all-pass round: `kvcake up` waits for readiness.
            pause = CHECK_EVERY_S if self.report()["ready"] else CHECK_EVERY_S / 4
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)
        self._close()
        if self._directory is not None:
            self._directory.close()

    async def check_once(self) -> None:
        checks = {"instances": self._instances(), "peers": self._peers()}
        if self.st.master or self.st.directory:
            checks.update(await asyncio.to_thread(self._remote_checks))
        self.checks = checks
        self.checked_at = time.monotonic()

    def _instances(self) -> tuple[bool, str]:
        cluster = self.st.cluster
        if cluster is None:
            return False, "connecting to the instances"
        missing = [r.value for r in (Role.PREFILL, Role.DECODE) if not cluster.alive(r)]
        if missing:
            return False, "no live " + " and no live ".join(missing) + " instance"
        return True, f"{len(cluster.instances)} connected"

    def _peers(self) -> tuple[bool, str]:
        cluster = self.st.cluster
        if cluster is None:
            return False, "no instance polled yet"
        now = time.monotonic()
        late = [f"{iid} ({now - t:.0f} s ago)" if t else f"{iid} (never)"
                for iid, t in sorted(cluster.last_answer.items())
                if now - t > PEER_FRESH_S]  # fmt: skip
        if late:
            return False, "no answer from " + ", ".join(late)
        return True, f"all answered within {PEER_FRESH_S:.0f} s"

    def _remote_checks(self) -> dict[str, tuple[bool, str]]:
        """``master`` and ``directory`` (the instances' directory: the proxy's ``directory``
        setting, else the one the master hosts)."""
        out: dict[str, tuple[bool, str]] = {}
        directory = self.st.directory
        if self.st.master:
            ok, detail, hosted = self._master()
            out["master"] = (ok, detail)
            directory = directory or hosted
            if not ok and not directory:
                out["directory"] = (False, "unknown (no master)")
        if directory:
            out["directory"] = self._directory_check(directory)
        return out

    def _master(self) -> tuple[bool, str, str]:
        """(answers?, detail, the directory it hosts)."""

        try:
            if self._conn is None:
                self._conn = connect(self.st.master, timeout_s=2.0)
            hello = self._conn.call(P.Heartbeat("", "proxy-health"))
        except Exception as exc:
            self._close()  # the next round connects afresh
            return False, f"master {self.st.master} unreachable: {exc}", ""
        return True, f"{self.st.master} answers", str(hello.directory or "")

    def _directory_check(self, address: str) -> tuple[bool, str]:
        cluster = self.st.cluster
        if cluster is None:
            return True, "no instance yet"
        if self._directory is None or self._directory.address != address:
            if self._directory is not None:
                self._directory.close()
            self._directory = DirectoryClient(address, timeout_s=2.0)
        missing = []
        for iid in sorted(cluster.instances):
            try:
                self._directory.lookup(segment_of(iid))
            except TransferError:  # unknown, or the directory is unreachable
                missing.append(str(segment_of(iid)))
        if missing:
            return False, f"directory {address} does not list " + ", ".join(missing)
        return True, f"lists all {len(cluster.instances)} KV segments"

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    def export(self, metrics: Any) -> None:
        """Set the gauges (proxy/metrics.py) from :meth:`report`."""
        rep = self.report()
        metrics.cluster_ready.set(1 if rep["ready"] else 0)
        for name, c in rep["checks"].items():
            metrics.health_check.labels(name).set(1 if c["ok"] else 0)
        total = rep["recent_requests"]
        metrics.failure_ratio.set(rep["recent_failures"] / total if total else 0.0)

    # --- the answer ---------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        age = time.monotonic() - self.checked_at if self.checked_at else None
        checks = dict(self.checks)
        if age is None or age > STALE_S:
            checks["checker"] = (False, "no health check has run recently")
        failed = [name for name, (ok, _) in checks.items() if not ok]
        bad, total = self.failure_ratio()
        reasons = [f"{name}: {detail}" for name, (ok, detail) in checks.items() if not ok]
        if bad:  # shown, never an input
            reasons.append(f"{bad} of {total} requests failed in the last "
                           f"{FAILURE_WINDOW_S:.0f} s")  # fmt: skip
        return {
            "ready": not failed,
            "failed": failed,
            "checks": {n: {"ok": ok, "detail": d} for n, (ok, d) in checks.items()},
            "reasons": reasons,
            "recent_failures": bad,
            "recent_requests": total,
            "checked_s_ago": round(age, 2) if age is not None else None,
        }


def summary(report: dict[str, Any] | None) -> str:
    """One line for ``kvcake status`` / ``kvcake top`` (the dashboard shows the same fields):
    ``ready`` or ``NOT READY`` naming every failing check, then the recent failure rate."""
    if not report:
        return "health: unknown (this proxy reports no health checks)"
    head = (
        "ready"
        if report["ready"]
        else "NOT READY: "
        + "; ".join(f"{n} ({c['detail']})" for n, c in report["checks"].items() if not c["ok"])
    )
    bad, total = report.get("recent_failures", 0), report.get("recent_requests", 0)
    tail = f"   {bad} of {total} requests failed in the last minute" if bad else ""
    return head + tail
