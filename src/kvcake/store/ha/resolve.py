"""Clients and storage nodes find the leader through etcd: ``master="etcd://HOST:PORT"``.

Address form (Mooncake's): ``etcd://host:port[,host:port...][/cluster]``; the cluster defaults
to ``kvcake`` (the masters' ``--cluster``). :class:`FailoverConnection` resolves the leader
from the leader key, and when a call fails for want of a master (connection refused or reset,
or a deposed leader's "not acknowledged", code -900) it forgets the address, waits a little and
tries the new leader, for up to ``failover_s``. Retried mutations carry the same request id
(the master RPC's deduplication); a new leader has no record of them, so a retried ``PutEnd``
whose first attempt did become durable answers ``ObjectNotFound``: the put was then not
acknowledged, which is allowed, and the object is readable.
"""

from __future__ import annotations

import socket
import time

import msgspec

from kvcake.core.auth import Authenticator
from kvcake.store import protocol as P
from kvcake.store.errors import RpcFailed, Unauthorized
from kvcake.store.ha.election import read_leader
from kvcake.store.ha.etcd import Etcd, EtcdError
from kvcake.store.rpc import MasterConnection

SCHEME = "etcd://"


def is_etcd(address: str) -> bool:
    return address.startswith(SCHEME)


def parse_etcd_address(address: str) -> tuple[str, str]:
    """``etcd://h:p,h2:p2/cluster`` -> (``"h:p,h2:p2"``, ``"cluster"``)."""
    if not is_etcd(address):
        raise RpcFailed(f"not an etcd:// address: {address!r}")
    rest = address[len(SCHEME) :]
    endpoints, _, cluster = rest.partition("/")
    if not endpoints:
        raise RpcFailed(f"etcd address without endpoints: {address!r}")
    return endpoints, cluster or "kvcake"


def leader_rpc(etcd: Etcd, cluster: str) -> str:
    try:
        info = read_leader(etcd, cluster)
    except EtcdError as exc:
        raise RpcFailed(f"cannot ask etcd for the leader: {exc}") from exc
    if info is None or not info.rpc:
        raise RpcFailed(f"no store master leads cluster {cluster!r} yet")
    return info.rpc


class FailoverConnection(MasterConnection):
    def __init__(
        self,
        address: str,
        timeout_s: float = 30.0,
        busy_poll_us: float = 0.0,
        retries: int = 1,
        failover_s: float = 30.0,
        auth: Authenticator | None = None,
    ):
        endpoints, self.cluster = parse_etcd_address(address)
        self.etcd = Etcd(endpoints, timeout_s=2.0)
        self.target = address
        self.failover_s = failover_s
        super().__init__("", timeout_s, busy_poll_us, retries, auth)

    def _connect(self) -> socket.socket:
        # Every (re)connect asks etcd: a connection is only re-made after one failed, and the
        # old address may be a leader cut off by a partition, where a connect just hangs.
        self.address = leader_rpc(self.etcd, self.cluster)
        try:
            return super()._connect()
        except RpcFailed:
            self.address = ""
            raise

    def call(self, msg: msgspec.Struct, retries: int | None = None) -> P.Reply:
        """As MasterConnection.call, following the leader for up to ``failover_s``;
        ``retries=0`` (a best-effort call) makes one attempt and does not wait for a leader."""
        deadline = time.monotonic() + (0 if retries == 0 else self.failover_s)
        pause = 0.05
        while True:
            try:
                if retries is None:
                    return super().call(msg)
                return super().call(msg, retries)  # type: ignore[call-arg,unused-ignore]
            except Unauthorized:  # a new leader has the same secret: do not wait for one
                raise
            except RpcFailed:
                self.close()
                self.address = ""
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.2)

    def shutdown(self) -> None:
        self.close()
        self.etcd.close()


def connect(
    address: str, timeout_s: float = 30.0, busy_poll_us: float = 0.0, retries: int = 1
) -> MasterConnection:
    """The connection for a master address: plain ``host:port`` or ``etcd://...``."""
    if is_etcd(address):
        return FailoverConnection(address, timeout_s, busy_poll_us, retries)
    return MasterConnection(address, timeout_s, busy_poll_us, retries)
