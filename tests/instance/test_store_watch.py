"""Instances log the loss of a storage node by name (issue 12 §2), from the master's events."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import pytest

from kvcake.core.api import StoreEvent, StoreEventKind
from kvcake.instance.store_watch import StoreWatch, describe, node_of
from tests.cluster import make_cluster
from tests.store.procs import Proc, spawn
from tests.waits import wait_until


def test_node_names_and_message() -> None:
    assert node_of("store-0") == "store-0" and node_of("store-0.ssd") == "store-0"
    assert node_of("kv/store-3") == "store-3"
    ev = StoreEvent(7, "m", StoreEventKind.SEGMENT_LOST, ("a", "b"), "memory", "store-0")
    assert describe(ev) == ("storage node store-0 lost (segment store-0 unregistered, 2 keys "
                            "lost their memory copy)")  # fmt: skip


def test_other_events_are_not_losses(caplog: pytest.LogCaptureFixture) -> None:
    w = StoreWatch("127.0.0.1:1")
    w.on_event(StoreEvent(1, "m", StoreEventKind.EVICTED_MEMORY, ("k",), "memory"))
    w.on_event(StoreEvent(2, "m", StoreEventKind.SEGMENT_LOST, (), "memory", ""))
    assert not w.lost and "lost" not in caplog.text


def test_unmounted_and_killed_nodes_are_logged_by_name(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kvcake.instance.store_watch")
    master = spawn("master", "--port", "0", "--http-port", "0", "--directory-port", "0",
                   "--client-ttl-s", "1", ready="master")  # fmt: skip
    procs: list[Proc] = [master]
    watch = StoreWatch(master.info["rpc"], "test").start()
    try:
        stores = {}
        for name in ("store-0", "store-1"):
            stores[name] = spawn("store-server", "--master", master.info["rpc"],
                                 "--segment-size", "8MB", "--name", name,
                                 ready="store-server")  # fmt: skip
            procs.append(stores[name])
        assert watch.subscribed.wait(10)
        stores["store-0"].stop(signal.SIGTERM)  # unmounts: lost at once
        # on_event appends to `lost`, then logs: wait for the log line, the later of the two.
        wait_until(lambda: "storage node store-0 lost" in caplog.text, timeout=10, every_s=0.1,
                   what="store-0 lost in the log", detail=lambda: caplog.text)  # fmt: skip
        assert "store-0" in [n for _, n, _ in watch.lost]
        assert "storage node store-0 lost (segment store-0 unregistered" in caplog.text
        assert "store-1" not in caplog.text
        stores["store-1"].stop(signal.SIGKILL)  # silent: lost when its TTL (1 s) expires
        wait_until(lambda: "storage node store-1 lost" in caplog.text, timeout=15, every_s=0.1,
                   what="store-1 lost in the log", detail=lambda: caplog.text)  # fmt: skip
        assert "store-1" in [n for _, n, _ in watch.lost]
    finally:
        watch.close()
        for p in reversed(procs):
            p.stop()
    assert not watch._thread.is_alive()


def test_a_cluster_instance_logs_the_lost_node(tmp_path: Path) -> None:
    """A real emulated cluster: stopping its storage node shows up in both instances' logs."""
    c = make_cluster(tmp_path, cluster={"prefill": 1, "decode": 1, "store_servers": 1,
                                        "store_size": "32MB"})  # fmt: skip
    with c:
        time.sleep(1.0)  # the instances' watches subscribe after their ready lines
        store = c.child("store-0")
        assert store.proc is not None
        store.proc.send_signal(signal.SIGTERM)
        store.proc.wait(15)
        logs = [c.child(n).log for n in ("prefill-0", "decode-0")]
        wait_until(lambda: all("storage node store-0 lost" in p.read_text() for p in logs),
                   timeout=20, every_s=0.1, what="'store-0 lost' in both instances' logs",
                   detail=lambda: [p.read_text()[-1500:] for p in logs])  # fmt: skip
