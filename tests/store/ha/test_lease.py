"""Leader leases, terms, deadlines (docs/store.md, "Leader leases and pauses").

The lease arithmetic and the pause watch are pure logic (a fake clock); the reply check is on a
real master over real sockets: its RPC, its Transfer Engine directory and its HTTP all refuse
while the lease is not held, every reply carries the term, and a connection that has seen a
newer term drops an older one's replies.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from kvcake.core.ids import ClientId
from kvcake.store import liveness
from kvcake.store import protocol as P
from kvcake.store.config import MasterConfig
from kvcake.store.errors import RpcFailed
from kvcake.store.ha.election import Election
from kvcake.store.liveness import PauseWatch, call_deadline_s, inherited_grace_s
from kvcake.store.master_server import Master
from kvcake.store.master_state import MasterState
from kvcake.store.rpc import MasterConnection, Terms
from kvcake.transfer.errors import TransferError
from kvcake.transfer.metadata import DirectoryClient


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def election(clock: Clock) -> Election:
    e = Election(None, "c", "n", ttl_s=2)  # type: ignore[arg-type]  # no etcd call is made
    e.clock = clock
    return e


def test_the_lease_deadline_counts_from_the_keepalive_send() -> None:
    clock = Clock()
    e = election(clock)
    assert not e.held()  # never granted
    e.lost.clear()
    sent = clock.t
    clock.t += 1.5  # the keepalive's reply came late: the deadline still counts from its send
    e._extend(sent, 2)
    assert e.deadline == pytest.approx(sent + 2 - 0.2)
    clock.t = sent + 1.79
    assert e.held()
    clock.t = sent + 1.8  # (e.g. the first thing a SIGSTOPped leader does on SIGCONT)
    assert not e.held() and e.lost.is_set()
    e._extend(clock.t, 2)  # a refresh that succeeds after the term ended revives nothing
    assert not e.held()


def test_call_deadline_and_inherited_grace() -> None:
    assert call_deadline_s(10.0) == pytest.approx(10 / 3)
    assert call_deadline_s(3.0) == 1.0
    assert call_deadline_s(3.0, rpc_timeout_s=0.5) == 0.5
    assert call_deadline_s(3.0, configured=7.0) == 7.0
    assert inherited_grace_s(10.0, 2.0) == pytest.approx(10 + 10 / 3 + 2)


def test_a_pause_of_the_master_is_not_its_clients_silence(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, boot = Clock(1000.0), Clock(50.0)
    monkeypatch.setattr(liveness, "boottime", boot)
    state = MasterState(MasterConfig(client_ttl_s=3), clock=clock)
    state.touch(ClientId("quiet"), "h")
    clock.t += 1
    state.touch(ClientId("chatty"), "h")
    watch = PauseWatch(state, 0.01)
    boot.t += 0.05
    assert watch.tick() == 0.0  # an ordinary round
    clock.t += 6.0  # stopped for 6 s, twice the TTL
    boot.t += 6.0
    assert watch.tick() == pytest.approx(5.99)
    assert state.expire_clients() == []
    assert state.clients[ClientId("chatty")].last_seen == pytest.approx(1000 + 1 + 5.99)
    clock.t += 3.0  # then silent for a TTL: expired as usual
    assert sorted(state.expire_clients()) == ["chatty", "quiet"]


@dataclass
class Switch:
    """A controllable leadership (what store/ha's Election offers the master)."""

    term: int
    on: bool = True

    def held(self) -> bool:
        return self.on


@pytest.fixture
def masters() -> Iterator[list[Master]]:
    started: list[Master] = []
    yield started
    for m in started:
        m.stop()


def serve(masters: list[Master], term: int, http: bool = False) -> tuple[Master, Switch]:
    cfg = MasterConfig(port=0, http_port=0 if http else -1, events_port=-1)
    m = Master(cfg)
    lead = Switch(term)
    m.leadership = lead
    m.start()
    masters.append(m)
    return m, lead


def test_a_master_answers_only_while_its_lease_holds(masters: list[Master]) -> None:
    m, lead = serve(masters, term=7, http=True)
    conn = MasterConnection(m.rpc_address, timeout_s=5, retries=0)
    directory = DirectoryClient(m.directory_address)
    url = f"http://{m.http_address}/get_all_keys"
    try:
        assert conn.call(P.Heartbeat("", "h")).term == 7
        assert conn.call(P.Exist("c", ["k"])).term == 7
        assert httpx.get(url, timeout=10).status_code == 200
        directory.list()
        lead.on = False
        with pytest.raises(RpcFailed, match="not the leader"):
            conn.call(P.GetReplicas("c", ["k"]))
        with pytest.raises(RpcFailed, match="not the leader"):
            conn.call(P.Heartbeat("", "h"))  # (on a new connection: the last one was closed)
        with pytest.raises(TransferError, match="not the leader"):
            directory.lookup("any")
        assert httpx.get(url, timeout=10).status_code == 503
    finally:
        directory.close()
        conn.close()


def test_a_reply_of_an_older_term_is_dropped(masters: list[Master]) -> None:
    new, _ = serve(masters, term=9)
    old, _ = serve(masters, term=4)
    terms = Terms()
    to_new = MasterConnection(new.rpc_address, timeout_s=5, retries=0, terms=terms)
    to_old = MasterConnection(old.rpc_address, timeout_s=5, retries=0, terms=terms)
    alone = MasterConnection(old.rpc_address, timeout_s=5, retries=0)
    try:
        assert to_old.call(P.Heartbeat("", "h")).term == 4  # nothing newer seen yet
        assert to_new.call(P.Heartbeat("", "h")).term == 9
        with pytest.raises(RpcFailed, match="dropped a reply of term 4"):
            to_old.call(P.Heartbeat("", "h"))
        assert alone.call(P.Heartbeat("", "h")).term == 4  # its own tracker saw no newer term
    finally:
        for c in (to_new, to_old, alone):
            c.close()


def test_terms_keep_the_highest_under_threads() -> None:
    terms = Terms()
    threads = [threading.Thread(target=terms.accept, args=(t,)) for t in range(1, 200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert terms.highest == 199 and not terms.accept(198) and terms.accept(199)


def test_the_store_server_takes_a_master_call_timeout() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvcake", "store-server", "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "--master-call-timeout-s" in out
    bad = subprocess.run(
        [sys.executable, "-m", "kvcake", "store-server", "--master-call-timeout-s", "-1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode != 0 and "master_call_timeout_s" in bad.stderr
