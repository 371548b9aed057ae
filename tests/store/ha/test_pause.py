"""A paused (SIGSTOPped) leader, with real etcd, masters, a storage node and clients: the two
failures of issue 30 pinned. Short TTLs keep them fast: ``--client-ttl-s 3`` (spawn_master),
the election lease 2 s, so the master call deadline is 1 s.

- Stale reads: a read queued in the frozen leader's socket is answered only if the leader
  still holds its lease when it replies; a woken leader refuses (and a client that saw the new
  term drops the old term's replies), so ``get(k1)`` never returns the bytes ``k2`` now has
  in ``k1``'s old range.
- A paused leader must not wipe the pool: the storage node's heartbeat gives up on the frozen
  leader after its deadline and finds the new one, which gave the inherited node a grace
  period, so no acknowledged object is lost, nor a put the new leader acknowledged.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest

from kvcake.core.errors import KvcakeError
from kvcake.store import protocol as P
from kvcake.store.client import Client
from kvcake.store.errors import ObjectNotFound
from kvcake.store.ha.election import read_leader
from kvcake.store.ha.etcd import Etcd
from kvcake.store.rpc import MasterConnection
from tests.store.ha.conftest import EtcdServer, leader_proc, spawn_master
from tests.store.procs import Proc, spawn, unreadable
from tests.waits import wait_until


@contextmanager
def pool(etcd: EtcdServer, cluster: str, node: bool) -> Iterator[tuple[str, Etcd, Proc, Proc]]:
    """(address, etcd client, leader A, standby B), with a storage node if ``node``;
    every process is stopped after (and woken first if it was left stopped)."""
    ectl = Etcd(etcd.url)
    started = [spawn_master(etcd.url, cluster)]
    addr = f"etcd://{etcd.hostport}/{cluster}"
    try:
        a = leader_proc(ectl, cluster, started)
        # B (a standby: A leads already) and the node start side by side (a start is seconds
        # of imports on a busy host).
        with ThreadPoolExecutor(2) as ex:
            jobs = [ex.submit(spawn_master, etcd.url, cluster)]
            if node:
                jobs.append(ex.submit(
                    spawn, "store-server", "--master", addr, "--segment-size", "16MiB",
                    "--name", f"{cluster}-node", ready="store-server",
                ))  # fmt: skip
            for job in jobs:
                with contextlib.suppress(Exception):  # (the failing one is raised below)
                    started.append(job.result())
            for job in jobs:
                job.result()
        yield addr, ectl, a, started[1]
    finally:
        for p in reversed(started):
            if p.popen.poll() is None:
                os.kill(p.popen.pid, signal.SIGCONT)
            p.stop()
        ectl.close()


def wait_leader(ectl: Etcd, cluster: str, proc: Proc, timeout: float = 20) -> None:
    def leads() -> bool:
        info = read_leader(ectl, cluster)
        return info is not None and bool(info.rpc) and info.name.endswith(f"/{proc.popen.pid}")

    wait_until(leads, timeout=timeout, what=f"master {proc.popen.pid} leading")


def retry(fn: Any, timeout: float = 20) -> Any:
    """An application's retry through a failover (a put can meet the node's remount)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except KvcakeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as exc:
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.mark.timeout(90)
def test_a_woken_leader_serves_no_stale_read(etcd: EtcdServer) -> None:
    cluster = "t-stale"
    size = 64 << 10
    v1, v2 = b"\x01" * size, b"\x02" * size
    with pool(etcd, cluster, node=False) as (addr, ectl, a, b):
        # The writer owns the segment (k2 is written into it locally, no directory needed)
        # and gives up on a frozen master after 1 s.
        writer = Client(master=addr, segment_size=4 << 20, rpc_timeout_s=1.0)
        # The reader waits 30 s per call: its read stays queued in A's socket.
        reader = Client(master=addr, master_call_timeout_s=30.0)
        leader = read_leader(ectl, cluster)
        assert leader is not None
        raw = MasterConnection(leader.rpc, timeout_s=30.0, retries=0)  # no term filter
        try:
            writer.put("k1", v1)
            where = writer.get_replica_desc("k1").replicas[0]
            assert bytes(reader.get("k1")) == v1
            os.kill(a.popen.pid, signal.SIGSTOP)
            time.sleep(0.2)
            raw_get, raw_out = in_thread(lambda: raw.call(P.GetReplicas("probe", ["k1"])))
            get, got = in_thread(lambda: bytes(reader.get("k1")))
            time.sleep(0.3)  # both requests now sit in the frozen leader's sockets
            wait_leader(ectl, cluster, b)
            retry(lambda: writer.remove("k1"))
            retry(lambda: writer.put("k2", v2))
            now = writer.get_replica_desc("k2").replicas[0]
            assert (now.segment, now.offset) == (where.segment, where.offset), "not k1's range"
            assert get.is_alive() and raw_get.is_alive(), "a request was answered while A slept"
            os.kill(a.popen.pid, signal.SIGCONT)
            get.join(30)
            raw_get.join(30)
        finally:
            raw.close()
            reader.close()
            writer.close()
    stale = got.get("value") == v2
    assert not stale, "get(k1) returned k2's bytes: a stale read"
    assert isinstance(got.get("error"), ObjectNotFound) or got.get("value") == v1, got
    # The master's own check, without a client's term filter: the woken leader refused.
    assert "error" in raw_out, f"the woken leader answered from its stale state: {raw_out}"


@pytest.mark.timeout(90)
def test_a_paused_leader_does_not_wipe_the_pool(etcd: EtcdServer) -> None:
    cluster = "t-wipe"
    values = {f"k{i}": os.urandom(1000 + i) for i in range(50)}
    with pool(etcd, cluster, node=True) as (addr, ectl, a, b):
        with Client(master=addr) as client:
            for k, v in values.items():
                client.put(k, v)
        os.kill(a.popen.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        wait_leader(ectl, cluster, b)
        with Client(master=addr) as client:  # (created now: it knows only the new leader)
            # Acknowledged by the new leader while A is still frozen (the node's remount
            # meets A's socket too).
            put, put_out = in_thread(lambda: retry(lambda: client.put("after", b"new leader")))
            # Frozen well past client_ttl_s (3 s) after B took over: a node whose heartbeat
            # were stuck on A's socket would have been expired by B by now.
            time.sleep(max(0.0, 7.0 - (time.monotonic() - t0)))
            os.kill(a.popen.pid, signal.SIGCONT)
            time.sleep(1.5)  # A wakes and steps down
            lost = unreadable(client, values)
            assert not lost, f"{len(lost)} of {len(values)} acknowledged keys lost: {lost[:3]}"
            put.join(30)
            assert "error" not in put_out, put_out
            time.sleep(0.5)  # (it once vanished a few ms after its acknowledgement)
            assert bytes(client.get("after")) == b"new leader"
        assert not any("unmounted" in ln for ln in b.lines), "".join(b.lines)
