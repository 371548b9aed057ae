"""Failures and pressure with real processes: a SIGKILLed storage node, eviction while readers
hold leases, and the SSD tier (offload, serve from disk, promotion, restart verification)."""

from __future__ import annotations

import contextlib
import hashlib
import signal
import threading
import time
from pathlib import Path

import pytest

from kvcake.core.errors import StoreError
from kvcake.store.client import Client
from kvcake.store.errors import LeaseExpired, NoSpace, ObjectNotFound
from kvcake.store.protocol import PutOptions
from tests.store.conftest import Factory
from tests.waits import wait_until


def value_of(key: str, size: int) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def test_killed_node_vanishes_paused_node_remounts(procs: Factory) -> None:
    master = procs("master", "--port", "0", "--http-port", "-1", "--client-ttl-s", "1")
    rpc = master.info["rpc"]
    a = procs("store-server", "--master", rpc, "--segment-size", "8MiB", "--name", "node-a")
    b = procs("store-server", "--master", rpc, "--segment-size", "8MiB", "--name", "node-b")
    with Client(master=rpc) as c:
        on_a = PutOptions(preferred_segments=["node-a"])
        on_b = PutOptions(preferred_segments=["node-b"])
        for i in range(10):
            c.put(f"a{i}", value_of(f"a{i}", 5000), on_a)
            c.put(f"b{i}", value_of(f"b{i}", 5000), on_b)
            c.put(f"ab{i}", value_of(f"ab{i}", 5000), PutOptions(replica_num=2))
        a.stop(signal.SIGKILL)
        wait_until(lambda: not c.is_exist("a0"), timeout=8, what="a0 gone with its node")
        for i in range(10):
            with pytest.raises(ObjectNotFound):
                c.get(f"a{i}")
            assert c.get(f"b{i}") == value_of(f"b{i}", 5000)
            assert c.get(f"ab{i}") == value_of(f"ab{i}", 5000)  # its other replica survives
            assert [r.segment for r in c.get_replica_desc(f"ab{i}").replicas] == ["node-b"]
        # node-b silent past the TTL (SIGSTOP): unmounted; when it wakes up it remounts
        b.popen.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: not c.is_exist("b0"), timeout=8, what="b0 gone")
            with pytest.raises(NoSpace):
                c.put("during", b"y")
        finally:
            b.popen.send_signal(signal.SIGCONT)
        wait_until(lambda: _put_ok(c, "after", on_b), timeout=8, what="a put onto node-b")
        assert c.get("after") == b"z" * 10
        assert [r.segment for r in c.get_replica_desc("after").replicas] == ["node-b"]


def test_eviction_under_pressure_keeps_leased_and_never_corrupts(procs: Factory) -> None:
    master = procs(
        "master", "--port", "0", "--http-port", "-1", "--client-ttl-s", "2", "--lease-ttl-s", "3"
    )
    rpc = master.info["rpc"]
    procs("store-server", "--master", rpc, "--segment-size", "2MiB", "--name", "small")
    size = 64 * 1024
    with Client(master=rpc) as writer, Client(master=rpc) as reader:
        for i in range(8):
            writer.put(f"hot{i}", value_of(f"hot{i}", size))
        hot = [f"hot{i}" for i in range(8)]
        assert reader.batch_get(hot) == [value_of(k, size) for k in hot]  # leases for 3 s
        errors: list[str] = []
        stop = threading.Event()

        def read_loop() -> None:
            # Re-reading the hot keys renews their leases; the reader also leases at most 8 of
            # the cold keys, so at most 16 of the segment's 32 slots are ever leased and every
            # put must find something to evict, however fast or slow this machine is.
            n = 0
            while not stop.is_set():
                if reader.batch_get(hot) != [value_of(k, size) for k in hot]:
                    errors.append("hot")
                key = f"cold{n % 8}"
                n += 1
                try:
                    got = reader.get(key)
                except (ObjectNotFound, LeaseExpired):
                    continue
                if got != value_of(key, size):
                    errors.append(key)

        t = threading.Thread(target=read_loop)
        t.start()
        acked = []
        for i in range(60):  # ~2x the segment: forces eviction
            try:
                writer.put(f"cold{i}", value_of(f"cold{i}", size))
                acked.append(f"cold{i}")
            except NoSpace as exc:
                errors.append(f"cold{i}: {exc}")
        stop.set()
        t.join()
        assert not errors, f"corrupted reads: {errors}"
        assert len(acked) == 60  # ~2x the segment: only eviction can have made the room
        for k in hot:  # leased: never evicted
            assert writer.is_exist(k)
        for k in acked:  # whatever survived is intact
            with contextlib.suppress(ObjectNotFound):
                assert writer.get(k) == value_of(k, size)


def test_ssd_offload_promotion_and_restart(procs: Factory, tmp_path: Path) -> None:
    master = procs(
        "master",
        "--port",
        "0",
        "--http-port",
        "-1",
        "--client-ttl-s",
        "1",
        "--lease-ttl-s",
        "0.2",
        "--promote-after-hits",
        "2",
    )
    rpc = master.info["rpc"]
    ssd = tmp_path / "ssd"
    flags = ("--master", rpc, "--segment-size", "1MiB", "--ssd-dir", str(ssd), "--name", "n1")
    node = procs("store-server", *flags)
    size = 32 * 1024
    with Client(master=rpc) as c:
        keys = [f"k{i}" for i in range(64)]  # 2 MiB into 1 MiB of memory
        for k in keys:
            c.put(k, value_of(k, size))
        # Looking a key up leases it (0.2 s here) and leased objects are never evicted, so poll
        # more slowly than the lease lapses: otherwise, when the puts outrun the master's
        # eviction tick, the polling itself keeps every object leased and nothing offloads.
        wait_until(
            lambda: any("disk" in _tiers(c, k) for k in keys), every_s=0.4, what="a disk replica"
        )
        time.sleep(0.3)  # let the lookups' leases lapse
        on_disk = [k for k in keys if _tiers(c, k) == {"disk"}]
        assert on_disk, "nothing was offloaded"
        k = on_disk[0]
        head, part = bytearray(10), bytearray(500)  # parts of a disk copy, into two buffers
        assert c.batch_get_into_ranges([k], [[(0, head), (1000, part)]]) == [510]
        assert head + part == value_of(k, size)[:10] + value_of(k, size)[1000:1500]
        assert c.get(k) == value_of(k, size)  # served from disk (2nd hit -> promotion)
        wait_until(lambda: "memory" in _tiers(c, k), what="promotion back to memory")
        assert c.get(k) == value_of(k, size)
        served = 0
        for key in keys:  # acknowledged objects are intact wherever they live (or evicted)
            with contextlib.suppress(ObjectNotFound):
                assert c.get(key) == value_of(key, size)
                served += 1
        assert served >= len(on_disk)
        node.stop()  # graceful: unmounts
        files = sorted(ssd.glob("*.obj"))  # listed once the node is down: no writer left
        assert len(files) >= 2
        wait_until(lambda: not c.is_exist(k), what="the key gone")
        victim = files[0]
        raw = bytearray(victim.read_bytes())
        raw[-1] ^= 0xFF  # flip a bit of the value
        victim.write_bytes(bytes(raw))
        (ssd / "junk.obj").write_bytes(b"not an object")
        procs("store-server", *flags)
        survivors = [key for key in keys if c.is_exist(key)]
        assert len(survivors) == len(files) - 1  # the corrupted copy was not trusted
        for key in survivors:
            assert c.get(key) == value_of(key, size)
        assert not victim.exists() and not (ssd / "junk.obj").exists()


def _tiers(c: Client, key: str) -> set[str]:
    try:
        return {r.tier for r in c.get_replica_desc(key).replicas}
    except StoreError:
        return set()


def _put_ok(c: Client, key: str, opts: PutOptions) -> bool:
    try:
        c.put(key, b"z" * 10, opts)
    except NoSpace:
        return False
    return True
