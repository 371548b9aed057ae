"""Liveness. The heartbeat thread outlives a failed round: a remount that raises something other
than a kvcake error (an OSError of a directory publish) must not end the client's only way
back into a master that forgot it (a stub connection: pure logic of :class:`Heartbeater`).
A master that was paused (SIGSTOP) past the client TTL keeps its clients when it wakes (real
processes): its own pause is not their silence."""

from __future__ import annotations

import os
import signal
import threading
import time

from kvcake.store import protocol as P
from kvcake.store.client import Client
from kvcake.store.liveness import Heartbeater
from tests.store.conftest import Factory
from tests.store.procs import unreadable


class ForgetfulMaster:
    """Answers every heartbeat with "mount again" (``count``: REMOUNT, a new leader that
    replayed us; FORGOTTEN, a master that dropped everything of ours); with ``once`` only the
    first, then 0 (it knows us again)."""

    def __init__(self, count: int = P.REMOUNT, once: bool = False) -> None:
        self.calls = 0
        self.count = count
        self.once = once

    def call(self, msg: object) -> P.Reply:
        self.calls += 1
        return P.Reply(count=0 if self.once and self.calls > 1 else self.count)

    def close(self) -> None:
        pass


def test_a_remount_that_raises_does_not_end_the_heartbeat() -> None:
    attempts: list[float] = []
    done = threading.Event()

    def remount() -> None:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise OSError("directory connection reset")  # not a KvcakeError
        done.set()

    hb = Heartbeater(ForgetfulMaster(), "c1", "127.0.0.1", 0.06, [remount])  # type: ignore[arg-type]
    hb.start()
    try:
        assert done.wait(5), "the heartbeat thread died with the first remount's error"
        assert len(attempts) >= 2 and hb._thread.is_alive()
    finally:
        hb.stop()


class MovedMaster:
    """A new leader that knows us already (count 0) and hosts another directory."""

    def call(self, msg: object) -> P.Reply:
        return P.Reply(count=0, directory="127.0.0.1:2")

    def close(self) -> None:
        pass


def test_a_leader_with_another_directory_is_followed_once() -> None:
    """The nemesis found clients that kept a dead leader's directory: their first data call
    registered them at the new leader, so no heartbeat ever said "remount"."""
    using = ["127.0.0.1:1"]
    remounts = []

    def remount() -> None:
        remounts.append(time.monotonic())
        using[0] = "127.0.0.1:2"  # what Client._remount's directory follow does

    hb = Heartbeater(MovedMaster(), "c1", "127.0.0.1", 0.06, [remount], lambda: using[0])  # type: ignore[arg-type]
    hb.start()
    try:
        time.sleep(0.3)  # ~15 heartbeats
    finally:
        hb.stop()
    assert len(remounts) == 1
    no_directory = Heartbeater(MovedMaster(), "c1", "127.0.0.1", 1, [], lambda: "")  # type: ignore[arg-type]
    assert not no_directory._directory_moved("127.0.0.1:2")  # an engine without one: nothing


def test_a_forgotten_node_cuts_its_transfer_connections_before_it_mounts() -> None:
    """FORGOTTEN: ``on_forgotten`` runs, then the remount -- writes still on their way for the
    dropped objects must not land in ranges the new mount hands out (nemesis, seed 4013).
    REMOUNT (a new leader that replayed our segments) or a moved directory: the objects are
    still ours, the connections stay."""

    def run(master: object, using: list[str] | None = None) -> list[str]:
        events: list[str] = []

        def remount() -> None:
            events.append("remount")
            if using:
                using[0] = "127.0.0.1:2"  # what Client._remount's directory follow does

        directory = (lambda: using[0]) if using else None
        hb = Heartbeater(master, "c1", "127.0.0.1", 0.06, [remount], directory,  # type: ignore[arg-type]
                         on_forgotten=[lambda: events.append("cut")])  # fmt: skip
        hb.start()
        try:
            time.sleep(0.3)  # ~5 heartbeats
        finally:
            hb.stop()
        return events

    forgotten = run(ForgetfulMaster(P.FORGOTTEN))
    assert forgotten[:2] == ["cut", "remount"] and len(forgotten) >= 4
    assert "cut" not in run(ForgetfulMaster(P.REMOUNT))
    assert run(MovedMaster(), ["127.0.0.1:1"]) == ["remount"]


def test_a_remount_that_failed_halfway_is_repeated_though_the_master_knows_us() -> None:
    events: list[str] = []
    done = threading.Event()

    def remount() -> None:
        events.append("remount")
        if events.count("remount") == 1:
            raise OSError("the disk segment's Mount failed")  # the memory one had succeeded
        done.set()

    hb = Heartbeater(
        ForgetfulMaster(P.FORGOTTEN, once=True), "c1", "127.0.0.1", 0.06, [remount],  # type: ignore[arg-type]
        on_forgotten=[lambda: events.append("cut")],
    )  # fmt: skip
    hb.start()
    try:
        assert done.wait(5), f"the failed remount was never repeated: {events}"
        time.sleep(0.2)  # more rounds that know us: no further remounts
    finally:
        hb.stop()
    assert events == ["cut", "remount", "remount"]


def test_a_failed_round_is_retried_soon_then_backs_off() -> None:
    hb = Heartbeater(ForgetfulMaster(), "c1", "127.0.0.1", 3.0, [])  # type: ignore[arg-type]
    waits = []
    for failed in range(6):
        hb._failed = failed
        waits.append(hb._pause())
    assert waits == [1.0, 0.2, 0.4, 0.8, 1.0, 1.0]  # the interval is ttl/3 = 1 s


def test_a_paused_master_keeps_its_clients(procs: Factory) -> None:
    master = procs("master", "--port", "0", "--http-port", "-1", "--client-ttl-s", "3")
    rpc = master.info["rpc"]
    procs("store-server", "--master", rpc, "--segment-size", "16MiB")
    values = {f"k{i}": os.urandom(1000 + i) for i in range(50)}
    with Client(master=rpc) as client:
        for k, v in values.items():
            client.put(k, v)
    os.kill(master.popen.pid, signal.SIGSTOP)
    try:
        time.sleep(6)  # twice the client TTL: every heartbeat meanwhile meets a frozen master
    finally:
        os.kill(master.popen.pid, signal.SIGCONT)
    time.sleep(1.5)  # the master's first housekeeping rounds after the wake
    with Client(master=rpc) as client:
        lost = unreadable(client, values)
    assert not lost, f"{len(lost)} of {len(values)} keys lost: {lost[:3]}"
    assert not any("unmounted" in ln for ln in master.lines), "".join(master.lines)
    assert any("paused for" in ln for ln in master.lines), "".join(master.lines)
