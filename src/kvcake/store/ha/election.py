"""Leader election through an etcd lease.

The leader key ``/kvcake/<cluster>/leader`` is created, only if absent, with a lease of
``ttl_s``; its ``create_revision`` names the term (the log fences on it). The leader refreshes
the lease every ``ttl_s / 4``; if no refresh succeeded for ``ttl_s`` (etcd unreachable: the
lease may be gone), or etcd says the lease expired, the term is over: ``lost`` is set and the
leader must stop acknowledging. A standby polls the key and campaigns when it is absent.
"""

from __future__ import annotations

import logging
import threading
import time

import msgspec

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
    got = etcd.get(leader_key(cluster))
    if got is None:
        return None
    try:
        return _DEC.decode(got[0])
    except msgspec.DecodeError:
        return None


class Election:
    def __init__(self, etcd: Etcd, cluster: str, name: str, ttl_s: int = 2, poll_s: float = 0.1):
        self.etcd = etcd
        self.key = leader_key(cluster)
        self.name = name
        self.ttl_s = ttl_s
        self.poll_s = poll_s
        self.lease = 0
        self.revision = 0
        self.lost = threading.Event()
        self._keeper: threading.Thread | None = None

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
        lease = self.etcd.grant(self.ttl_s)
        value = _ENC.encode(LeaderInfo(self.name))
        ok, data = self.etcd.txn([cmp_create(self.key, 0)], [op_put(self.key, value, lease)])
        if not ok:
            self.etcd.revoke(lease)
            return False
        self.lease = lease
        self.revision = int(data["header"]["revision"])
        self.lost.clear()
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
        last_ok = time.monotonic()
        while not self.lost.is_set():
            try:
                ttl = self.etcd.keepalive(self.lease, timeout_s=self.ttl_s / 2)
                if ttl <= 0:
                    log.error("ha: %s lost its lease (expired)", self.name)
                    self.lost.set()
                    return
                last_ok = time.monotonic()
            except EtcdError as exc:
                log.warning("ha: lease refresh failed: %s", exc)
            if time.monotonic() - last_ok >= self.ttl_s * 0.8:
                log.error(
                    "ha: %s cut off from etcd for %.1fs: stepping down", self.name, self.ttl_s
                )
                self.lost.set()
                return
            self.lost.wait(self.ttl_s / 4)

    def resign(self) -> None:
        """End the term now (clean stop): the lease and so the leader key go at once."""
        self.lost.set()
        if self.lease:
            try:
                self.etcd.revoke(self.lease)
            except EtcdError as exc:
                log.warning("ha: could not revoke the lease: %s", exc)
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(timeout=2)
