"""Clients and storage nodes find the leader through etcd: ``master="etcd://HOST:PORT"``.

Address form (Mooncake's): ``etcd://host:port[,host:port...][/cluster]``; the cluster defaults
to ``kvcake`` (the masters' ``--cluster``). :class:`FailoverConnection` resolves the leader
from the leader key, and when a call fails for want of a master (connection refused or reset,
or a deposed leader's "not acknowledged", code -900) it forgets the address, waits a little and
tries the new leader, for up to ``failover_s``. Retried mutations carry the same request id
(the master RPC's deduplication); a new leader has no record of them, so a retried ``PutEnd``
whose first attempt did become durable answers ``ObjectNotFound``: the put was then not
acknowledged, which is allowed, and the object is readable.

Terms: every connection of this process to one pool shares a :class:`~kvcake.store.rpc.Terms`
(the highest leader term seen, from replies and from the leader key itself), so once any of
them has met the new leader, a late reply of the deposed one is dropped on all of them and the
call goes to the leader again. Each try of a call has the master call deadline
(``timeout_s``): a leader frozen with our request in its socket costs that long, not 30 s.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import msgspec

from kvcake.core.auth import Authenticator
from kvcake.core.backoff import pauses
from kvcake.store import protocol as P
from kvcake.store.errors import RpcFailed, Unauthorized
from kvcake.store.ha.election import read_leader_term
from kvcake.store.ha.etcd import Etcd, EtcdError
from kvcake.store.rpc import MasterConnection, Terms

SCHEME = "etcd://"
_TERMS: OrderedDict[str, Terms] = OrderedDict()  # per pool address, the most recent 64
_TERMS_LOCK = threading.Lock()


def terms_of(address: str) -> Terms:
    """The term tracker every connection of this process to ``address`` shares."""
    with _TERMS_LOCK:
        terms = _TERMS.get(address)
        if terms is None:
            terms = _TERMS[address] = Terms()
            while len(_TERMS) > 64:
                _TERMS.popitem(last=False)
        _TERMS.move_to_end(address)
        return terms


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


def leader_rpc(etcd: Etcd, cluster: str, terms: Terms | None = None) -> str:
    """The leader's RPC address; ``terms`` learns its term (etcd's word over any reply's)."""
    try:
        got = read_leader_term(etcd, cluster)
    except EtcdError as exc:
        raise RpcFailed(f"cannot ask etcd for the leader: {exc}") from exc
    if got is None or not got[0].rpc:
        raise RpcFailed(f"no store master leads cluster {cluster!r} yet")
    info, term = got
    if terms is not None and not terms.accept(term):
        terms.reset(term)  # etcd was wiped: the count starts again
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
        self.etcd = Etcd(endpoints, timeout_s=min(2.0, max(0.5, timeout_s)))
        self.target = address
        self.failover_s = failover_s
        super().__init__("", timeout_s, busy_poll_us, retries, auth, terms_of(address))

    def _connect(self) -> socket.socket:
        # Every (re)connect asks etcd: a connection is only re-made after one failed, and the
        # old address may be a leader cut off by a partition, where a connect just hangs.
        self.address = leader_rpc(self.etcd, self.cluster, self.terms)
        try:
            return super()._connect()
        except RpcFailed:
            self.address = ""
            raise

    def call(
        self,
        msg: msgspec.Struct,
        retries: int | None = None,
        meanwhile: Callable[[], None] | None = None,
    ) -> P.Reply:
        """As MasterConnection.call, following the leader for up to ``failover_s``;
        ``retries=0`` (a best-effort call) makes one attempt and does not wait for a leader.
        ``meanwhile`` runs with each attempt (it must be idempotent: a put's sums are)."""
        deadline = time.monotonic() + (0 if retries == 0 else self.failover_s)
        waits = pauses(0.05, 0.2)
        while True:
            try:
                return super().call(msg, retries, meanwhile)
            except Unauthorized:  # a new leader has the same secret: do not wait for one
                raise
            except RpcFailed:
                self.close()
                self.address = ""
                pause = next(waits)
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)

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
