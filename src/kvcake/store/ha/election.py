"""Leader election through an etcd lease.

The leader key ``/kvcake/<cluster>/leader`` is created, only if absent, with a lease of
``ttl_s``; its ``create_revision`` names the term (the log fences on it, replies carry it). The
leader refreshes the lease every ``ttl_s / 4``. It holds the lease until a deadline counted
from the moment its last successful refresh was *sent* (etcd restarts the lease's TTL when it
processes the refresh, which is later), less a margin, on ``CLOCK_BOOTTIME``: that clock runs
while the process is stopped (SIGSTOP) and while the host is suspended, so a paused leader
finds the deadline passed the moment it wakes, before it could answer from a state a standby
has since changed. :meth:`Election.held` is asked right before every reply; once the deadline
passed, or etcd says the lease expired, the term is over: ``lost`` is set and the leader steps
down. A standby polls the key and campaigns when it is absent (the lease expired in etcd, which
is no earlier than our deadline).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import msgspec

from kvcake.core import clocks
from kvcake.store.ha.etcd import Etcd, EtcdError, cmp_create, op_get, op_put
from kvcake.store.ha.etcdlog import cluster_prefix

log = logging.getLogger(__name__)


class LeaderInfo(msgspec.Struct, frozen=True):
    """The leader key's value: where the leader serves (empty while it is still replaying)."""

    name: str
    rpc: str = ""
    http: str = ""


_ENC = msgspec.json.Encoder()
_DEC = msgspec.json.Decoder(LeaderInfo)


def leader_key(cluster: str) -> bytes:
    return cluster_prefix(cluster) + b"leader"


def read_leader(etcd: Etcd, cluster: str) -> LeaderInfo | None:
    got = read_leader_term(etcd, cluster)
    return None if got is None else got[0]


def read_leader_term(etcd: Etcd, cluster: str) -> tuple[LeaderInfo, int] | None:
    """The leader key's value and its term (create revision), or None."""
    got = etcd.get(leader_key(cluster))
    if got is None:
        return None
    try:
        return _DEC.decode(got[0]), got[1]
    except msgspec.DecodeError:
        return None


# Seconds on ``CLOCK_BOOTTIME`` (counts time stopped and suspended too); a partial of the
# builtin: it is read before every reply.
boottime: Callable[[], float] = clocks.boottime


def lease_margin(ttl_s: float) -> float:
    """Held this much less than the TTL: for the rate difference of two hosts' clocks and
    etcd's own timer resolution (a lease expires no earlier than its TTL)."""
    return max(0.2, ttl_s * 0.1)


class Election:
    def __init__(self, etcd: Etcd, cluster: str, name: str, ttl_s: int = 2, poll_s: float = 0.1):
        self.etcd = etcd
        self.key = leader_key(cluster)
        self.name = name
        self.ttl_s = ttl_s
        self.poll_s = poll_s
        self.lease = 0
        self.revision = 0
        self.term = 0  # = revision while leading (what replies carry)
        self.lost = threading.Event()
        self.margin = lease_margin(ttl_s)
        # boottime() until which the lease surely holds; 0 whenever ``lost`` is set (both
        # change under _lock, so held() reads one float)
        self.deadline = 0.0
        self._lock = threading.Lock()
        self.clock: Callable[[], float] = boottime
        self._keeper: threading.Thread | None = None

    def held(self) -> bool:
        """The lease surely holds now. Asked right before each reply: when its deadline has
        passed the term ends here, at once (``lost``: the master steps down)."""
        if self.clock() < self.deadline:
            return True
        self._end("its lease deadline passed (paused, or cut off from etcd)")
        return False

    def _end(self, why: str) -> None:
        with self._lock:
            self.deadline = 0.0
            if self.lost.is_set():
                return
            self.lost.set()
        log.error("ha: %s ends term %d: %s", self.name, self.revision, why)

    def _extend(self, sent: float, ttl_s: float) -> None:
        """A grant or refresh sent at ``sent`` succeeded with ``ttl_s``."""
        with self._lock:
            if not self.lost.is_set():
                self.deadline = max(self.deadline, sent + min(ttl_s, self.ttl_s) - self.margin)

    def campaign(self, stop: threading.Event) -> bool:
        """Block until this node leads (True) or ``stop`` is set (False)."""
        while not stop.is_set():
            try:
                if self.etcd.get(self.key) is None and self._try():
                    return True
            except EtcdError as exc:
                log.debug("campaign: %s", exc)
            except Exception:  # a malformed reply must not end the campaign thread
                log.exception("campaign: unexpected failure")
            stop.wait(self.poll_s)
        return False

    def _try(self) -> bool:
        sent = self.clock()
        lease = self.etcd.grant(self.ttl_s)
        value = _ENC.encode(LeaderInfo(self.name))
        ok, data = self.etcd.txn([cmp_create(self.key, 0)], [op_put(self.key, value, lease)])
        if not ok:
            self.etcd.revoke(lease)
            return False
        self.lease = lease
        self.revision = self.term = int(data["header"]["revision"])
        with self._lock:
            self.deadline = 0.0
            self.lost.clear()
        self._extend(sent, self.ttl_s)
        self._keeper = threading.Thread(target=self._keep, name="ha-lease", daemon=True)
        self._keeper.start()
        log.warning("ha: %s is the leader (term %d)", self.name, self.revision)
        return True

    def announce(self, info: LeaderInfo) -> bool:
        """Publish where we serve; False if we are no longer the leader."""
        put = op_put(self.key, _ENC.encode(info), self.lease)
        ok, _ = self.etcd.txn([cmp_create(self.key, self.revision)], [put], [op_get(self.key)])
        return ok

    def _keep(self) -> None:
        while not self.lost.is_set():
            sent = self.clock()
            # Never wait on etcd past the deadline: the term must end then, request or not.
            wait = min(self.ttl_s / 2, self.deadline - sent)
            try:
                ttl = self.etcd.keepalive(self.lease, timeout_s=max(0.05, wait))
                if ttl <= 0:
                    self._end("etcd says its lease expired")
                    return
                self._extend(sent, ttl)
            except EtcdError as exc:
                log.warning("ha: lease refresh failed: %s", exc)
            left = self.deadline - self.clock()
            if left <= 0:
                self._end("no lease refresh succeeded in time (cut off from etcd?)")
                return
            # Wake at the deadline at the latest: the term ends then even with no request.
            self.lost.wait(min(self.ttl_s / 4, left))

    def resign(self) -> None:
        """End the term now (clean stop): the lease and so the leader key go at once."""
        with self._lock:
            self.deadline = 0.0
            self.lost.set()
        if self.lease:
            try:
                self.etcd.revoke(self.lease)
            except EtcdError as exc:
                log.warning("ha: could not revoke the lease: %s", exc)
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(timeout=2)
