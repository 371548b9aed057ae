"""Path health and selection (the paper's topology matrix + "avoid a broken NIC").

A segment lists paths with tiers (0 = preferred, 1 = secondary...). Lanes spread over the up
paths of the best tier that has any. A path that failed is *down*: it is skipped until a probe
(a fresh connection answering a ``Probe``) succeeds; probes run at most every
``probe_interval_s`` per path: in the background while other paths of the tier are up,
inline in the lane when no path is left.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable

from kvcake.transfer.types import PathInfo


@functools.lru_cache(maxsize=1024)
def _best_tier(paths: tuple[PathInfo, ...]) -> tuple[str, ...]:
    if not paths:
        return ()
    top = min(p.tier for p in paths)
    return tuple(p.address for p in paths if p.tier == top)


class PathHealth:
    def __init__(self, probe: Callable[[str], bool], probe_interval_s: float):
        self._probe = probe
        self._interval = probe_interval_s
        self._lock = threading.Lock()
        self._down: dict[str, float] = {}  # address -> earliest next probe (monotonic)
        self.failures: dict[str, int] = {}
        self.probes: dict[str, int] = {}
        self._threads: list[threading.Thread] = []

    def is_up(self, address: str) -> bool:
        return address not in self._down

    def down(self) -> list[str]:
        with self._lock:
            return sorted(self._down)

    def mark_down(self, address: str) -> None:
        with self._lock:
            self._down[address] = time.monotonic() + self._interval
            self.failures[address] = self.failures.get(address, 0) + 1

    def mark_up(self, address: str) -> None:
        with self._lock:
            self._down.pop(address, None)

    def choose(self, paths: Iterable[PathInfo], lane: int) -> str | None:
        """An up path for ``lane`` (round-robin within the best tier), else a down one whose
        probe is due and succeeds now, else ``None``."""
        if not self._down:  # the common case: everything up, no bookkeeping
            if type(paths) is tuple and len(paths) == 1:  # one path: no tier to pick
                return paths[0].address
            best = _best_tier(tuple(paths))
            return best[lane % len(best)] if best else None
        by_tier: dict[int, list[str]] = {}
        for p in paths:
            by_tier.setdefault(p.tier, []).append(p.address)
        for tier in sorted(by_tier):
            ups = [a for a in by_tier[tier] if a not in self._down]
            if ups:
                # Paths are up: probe due down ones in the background, never stall the lane.
                for addr in by_tier[tier]:
                    if addr in self._down and self._claim_probe(addr):
                        self._background_probe(addr)
                return ups[lane % len(ups)]
        for tier in sorted(by_tier):
            for addr in by_tier[tier]:
                if self._claim_probe(addr) and self._run_probe(addr):
                    return addr
        return None

    def _background_probe(self, addr: str) -> None:
        t = threading.Thread(target=self._run_probe, args=(addr,), daemon=True)
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def close(self) -> None:
        """Wait for background probes (each is bounded by the connect timeout)."""
        with self._lock:
            threads, self._threads = self._threads, []
        for t in threads:
            t.join()

    def _run_probe(self, addr: str) -> bool:
        with self._lock:
            self.probes[addr] = self.probes.get(addr, 0) + 1
        ok = self._probe(addr)
        if ok:
            self.mark_up(addr)
        return ok

    def _claim_probe(self, addr: str) -> bool:
        with self._lock:
            due = self._down.get(addr)
            if due is None or time.monotonic() < due:
                return False
            self._down[addr] = time.monotonic() + self._interval  # one prober at a time
            return True
