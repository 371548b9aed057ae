"""The master processes of ``kvcake master --etcd-endpoints`` / ``--state-dir``.

HA: every master campaigns; the winner replays the log from etcd into a fresh state, starts
serving on its configured ports and publishes its address in the leader key; the others wait.
Every reply is sent only while the leader's lease surely holds (``Election.held``, checked
right before the send) and carries the term. When the term ends (the lease's deadline passed,
e.g. after a SIGSTOP; etcd says it expired; a fenced log write) the leader stops serving at
once, drops its state and campaigns again as a standby, so a master cut off from etcd or paused
neither acknowledges nor serves stale reads. SIGTERM resigns (revokes the
lease) so a standby takes over without waiting for the TTL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from kvcake.store.config import MasterConfig
from kvcake.store.ha.config import HaConfig
from kvcake.store.ha.durable import DurableMaster
from kvcake.store.ha.election import Election, LeaderInfo
from kvcake.store.ha.etcd import Etcd
from kvcake.store.ha.etcdlog import EtcdOpLog
from kvcake.store.ha.filelog import FileOpLog
from kvcake.store.master_server import Master

log = logging.getLogger(__name__)


def open_state_dir(cfg: MasterConfig, ha: HaConfig) -> DurableMaster:
    """A master that logs to ``ha.state_dir`` and starts from what it holds (not started)."""
    assert ha.state_dir is not None
    oplog = FileOpLog(ha.state_dir, ha.snapshot_every, ha.commit_delay_us / 1e6, ha.commit_siblings)
    oplog.snapshot_bytes = ha.snapshot_bytes
    view = oplog.load()
    log.warning(
        "master: state dir %s: %d segments, %d objects",
        ha.state_dir,
        len(view.segments),
        len(view.objects),
    )
    return DurableMaster(cfg, view, oplog, ha.cluster)


class HaMaster:
    def __init__(
        self,
        cfg: MasterConfig,
        ha: HaConfig,
        on_leader: Callable[[DurableMaster, int], None] | None = None,
    ):
        self.cfg = cfg
        self.ha = ha
        self.name = f"{socket.gethostname()}/{os.getpid()}"
        self.etcd = Etcd(ha.etcd_endpoints, timeout_s=max(1.0, ha.ha_lease_ttl_s / 2))
        self.election = Election(self.etcd, ha.cluster, self.name, ha.ha_lease_ttl_s)
        self.on_leader = on_leader
        self.master: DurableMaster | None = None
        self._term_over = threading.Event()
        _warm_up(cfg)

    def run(self, stop: threading.Event) -> None:
        """Campaign, lead, step down, repeat, until ``stop``."""
        while self.election.campaign(stop):
            self._term_over.clear()
            try:
                self.master = self._lead()
            except Exception:
                log.exception("ha: could not take over; resigning")
                self.election.resign()
                continue
            if self.on_leader is not None:
                self.on_leader(self.master, self.election.revision)
            # Woken the moment the term ends (a reply found the lease gone, the keeper's refresh
            # failed, the log was fenced); ``stop`` is looked at every 50 ms.
            while not (stop.is_set() or self._term_over.is_set()):
                if self.election.lost.wait(0.05):
                    break
            log.warning("ha: %s ends its term", self.name)
            self.step_down()
        self.etcd.close()

    def step_down(self) -> None:
        """Stop serving and end the term; never raises (a master left half-stopped would keep
        its threads, and so its process, alive)."""
        master, self.master = self.master, None
        if master is not None:
            try:
                master.stop()
            except Exception:
                log.exception("ha: stopping the master failed")
        self.election.resign()

    def _lead(self) -> DurableMaster:
        oplog = EtcdOpLog(
            self.etcd,
            self.ha.cluster,
            self.election.revision,
            self.ha.snapshot_every,
            depth=self.ha.commit_depth,
            commit_delay_s=self.ha.commit_delay_us / 1e6,
            commit_siblings=self.ha.commit_siblings,
        )
        oplog.on_failure = lambda exc: self._term_over.set()
        oplog.snapshot_bytes = self.ha.snapshot_bytes
        t0 = time.monotonic()
        view = oplog.load()
        t1 = time.monotonic()
        master = DurableMaster(self.cfg, view, oplog, self.ha.cluster)
        t2 = time.monotonic()
        master.leadership = self.election  # every reply checks the lease, carries the term
        master.failover_s = self.ha.ha_lease_ttl_s  # the inherited clients' grace includes it
        try:
            master.start()
            t3 = time.monotonic()
            info = LeaderInfo(self.name, master.rpc_address, master.http_address)
            if not self.election.announce(info):
                raise RuntimeError("lost the leader key before announcing")
        except BaseException:
            master.stop()
            raise
        # Each step's time: a slow take-over says where it went (docs/benchmarks.md, "Nemesis").
        log.warning(
            "ha: replayed %d segments, %d objects in %.2fs (log %.2fs, state %.2fs, start %.2fs"
            " of which the fence floor %.2fs, announce %.2fs)",
            len(view.segments), len(view.objects), time.monotonic() - t0, t1 - t0, t2 - t1,
            t3 - t2, master.floor_wait_s, time.monotonic() - t3,
        )  # fmt: skip
        return master


def _warm_up(cfg: MasterConfig) -> None:
    """Import what a master imports lazily (HTTP, directory, events: seconds on a busy host)
    while still a standby, so that taking over costs only the replay."""

    Master(dataclasses.replace(cfg, port=0, http_port=-1))  # constructed, never started
    for module in ("kvcake.store.events", "kvcake.store.http"):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
