"""Mooncake's dummy client over kvcake: ``setup_dummy`` attaching to kvcake's ``mooncake_client``
stand-in (real processes on loopback, started through the installed scripts). Expected values
are the wheel's (0.3.13.post1, probed; docs/compat/mooncake.md, "Dummy clients")."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvcake.compat.mooncake import MooncakeDistributedStore
from kvcake.compat.mooncake import _dummy_wire as W
from kvcake.core import framing
from kvcake.core.ports import free_port
from tests.compat.test_mooncake_programs import Prog, bin_dir
from tests.waits import wait_until

__all__ = ["bin_dir"]  # the fixture, shared with test_mooncake_programs
MB = 1024 * 1024
LEASE_MS = 100  # a read leases its object this long (removes wait it out, as Mooncake's suite)


def start_client(bin_dir: Path, rpc: str, env: dict[str, str] | None = None) -> tuple[Prog, str]:
    port = free_port()
    client = Prog(
        str(bin_dir / "mooncake_client"), f"--master_server_address={rpc}", f"--port={port}",
        "--global_segment_size=64MB", "--metadata_server=P2PHANDSHAKE", env=env,
    )  # fmt: skip
    info = client.wait_line("mooncake_client segment=")
    assert info["port"] == f"127.0.0.1:{port}"
    return client, info["port"]


@pytest.fixture(scope="module")
def cluster(bin_dir: Path) -> Iterator[tuple[str, Prog, str]]:
    """(master rpc address, the real client, its dummy-client address)."""
    master = Prog(
        str(bin_dir / "mooncake_master"),  # Mooncake's ports: 0 would mean 50051 and 9003
        f"--rpc_port={free_port()}", f"--metrics_port={free_port()}",
        f"--default_kv_lease_ttl={LEASE_MS}",
    )  # fmt: skip
    procs = [master]
    try:
        rpc = master.wait_line("master rpc=")["rpc"]
        client, address = start_client(bin_dir, rpc)
        procs.append(client)
        yield rpc, client, address
    finally:
        for p in reversed(procs):
            p.stop()


@pytest.fixture
def dummy(cluster: tuple[str, Prog, str]) -> Iterator[MooncakeDistributedStore]:
    store = MooncakeDistributedStore()
    assert store.setup_dummy(64 * MB, 4 * MB, cluster[2]) == 0
    yield store
    store.remove_all(True)
    store.close()


def test_no_real_client_answers_minus_one() -> None:
    store = MooncakeDistributedStore()
    t0 = time.monotonic()
    assert store.setup_dummy(64 * MB, 4 * MB, f"127.0.0.1:{free_port()}") == -1
    assert time.monotonic() - t0 < 5  # the wheel takes about 4.3 s for the same -1
    assert store.put("k", b"v") == -1 and store.get("k") == b""  # still not set up
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        t0 = time.monotonic()
        assert store.setup_dummy(64 * MB, 4 * MB, f"127.0.0.1:{silent.getsockname()[1]}") == -1
        assert time.monotonic() - t0 < 10


def test_core_families_through_the_real_client(dummy: MooncakeDistributedStore) -> None:
    s = dummy
    assert isinstance(s, MooncakeDistributedStore)
    assert (s.get_hostname(), s.health_check(), s.setup_dummy(1, 1, "x:1")) == ("", 2, 0)
    assert s.put("k1", b"hello") == 0 and s.put("k1", b"other") == 0  # put never overwrites
    assert (s.get("k1"), s.get("missing"), s.get_size("k1"), s.get_size("missing")) == (
        b"hello", b"", 5, -704,
    )  # fmt: skip
    assert (s.is_exist("k1"), s.is_exist("missing"), s.batch_is_exist(["k1", "missing"])) == (
        1, 0, [1, 0],
    )  # fmt: skip
    assert s.put_parts("kp", b"ab", b"cd") == 0 and s.get("kp") == b"abcd"
    assert s.put_batch(["b1", "b2"], [b"one", b"two"]) == 0
    assert s.upsert("b3", b"three") == 0
    assert s.get_batch(["b1", "b2", "b3", "missing"]) == [b"one", b"two", b"three", b""]
    assert s.put("big", b"x" * (4 * MB + 1)) == -600  # larger than the local buffer (the wheel)
    assert s.put("", b"a") == -600 and s.put("e", b"") == -600
    many = [bytes([i]) * MB for i in range(10)]  # 10 MiB through a 4 MiB local buffer
    assert s.put_batch([f"m{i}" for i in range(10)], many) == 0
    assert s.get_batch([f"m{i}" for i in range(10)]) == many
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert s.put_tensor("t", t) == 0 and torch.equal(s.get_tensor("t"), t)
    n = s.get_size("t")
    tp = s.alloc_from_mem_pool(n)
    assert s.register_buffer(tp, n) == 0 and torch.equal(s.get_tensor_into("t", tp, n), t)
    assert s.batch_get_tensor_into(["t", "u"], [tp], [n]) == [-600, -600]  # the wheel's, probed
    time.sleep(3 * LEASE_MS / 1000)
    assert (s.remove("k1"), s.remove("missing"), s.batch_remove(["kp", "missing"])) == (
        0, -704, [0, -704],
    )  # fmt: skip
    assert s.remove_by_regex("^b[0-9]$") == 3 and s.get("b1") == b""
    assert (s.init_all("tcp", "", 1), s.get_replica_desc("t"), s.batch_get_replica_desc(["t"])) == (
        -1, [], {},
    )  # fmt: skip
    assert s.batch_put_session_start(["s"], [3]) == [-600]
    assert s.create_copy_task("t", ["x"]) == ((0, 0), -600)


def test_values_larger_than_the_local_buffer_come_back(
    cluster: tuple[str, Prog, str], dummy: MooncakeDistributedStore
) -> None:
    normal = MooncakeDistributedStore()
    assert normal.setup("127.0.0.1", "P2PHANDSHAKE", 0, 32 * MB, "tcp", "", cluster[0]) == 0
    try:
        value = np.random.default_rng(2).bytes(9 * MB)
        assert normal.put("large", value) == 0
        assert dummy.get("large") == value  # inline: 9 MiB > the dummy's 4 MiB local buffer
        assert dummy.put("from-dummy", b"seen by others") == 0
        assert normal.get("from-dummy") == b"seen by others"  # it went into the pool
    finally:
        normal.close()


def test_pointer_calls_use_shared_memory(dummy: MooncakeDistributedStore) -> None:
    s, size = dummy, 3 * MB
    ptr = s.alloc_from_mem_pool(size)
    assert ptr and s.alloc_from_mem_pool(0) == 0 and s.alloc_from_mem_pool(128 * MB) == 0
    buf = (ctypes.c_char * size).from_address(ptr)
    assert s.register_buffer(ptr, 4096) == -1 and s.register_buffer(ptr + 1, size - 1) == -1
    assert s.batch_put_from(["p"], [ptr], [10]) == [-600]  # not registered yet (the wheel)
    assert s.register_buffer(ptr, size) == 0 and s.register_buffer(ptr, size) == 0
    data = [np.random.default_rng(i).bytes(MB) for i in range(3)]
    for i, d in enumerate(data):
        ctypes.memmove(ptr + i * MB, d, MB)
    keys = ["p0", "p1", "p2"]
    assert s.batch_put_from(keys, [ptr + i * MB for i in range(3)], [MB] * 3) == [0, 0, 0]
    assert s.put_from("p3", ptr, 5) == 0 and s.get("p3") == data[0][:5]
    ctypes.memset(ptr, 0, size)
    assert s.batch_get_into(keys[::-1], [ptr + i * MB for i in range(3)], [MB] * 3) == [MB] * 3
    assert [bytes(buf[i * MB : (i + 1) * MB]) for i in range(3)] == data[::-1]
    assert s.get_into("p3", ptr + 100, 100) == 5 and bytes(buf[100:105]) == data[0][:5]
    assert s.batch_get_into(keys[:2], [ptr], [MB]) == [-600, -600]  # lengths differ
    outside = ctypes.create_string_buffer(4096)
    addr = ctypes.addressof(outside)
    assert (s.register_buffer(addr, 4096), s.put_from("o", addr, 10)) == (-1, -600)
    assert s.batch_get_into(["p3"], [addr], [4096]) == [-600]
    assert s.unregister_buffer(ptr) == 0 and s.unregister_buffer(ptr) == -1
    assert s.get_into("p3", ptr, 100) == -600  # unregistered again


def _request(sock: socket.socket, msg: object) -> W.Reply:
    framing.send_frame(sock, W.REQUESTS, 7, msg)  # type: ignore[arg-type]
    frame = framing.read_frame(sock, W.REPLIES, W.REPLY_LIMITS)
    assert frame is not None and isinstance(frame.msg, W.Reply)
    return frame.msg


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_garbage_is_refused_and_the_server_keeps_serving(
    cluster: tuple[str, Prog, str], dummy: MooncakeDistributedStore
) -> None:
    host, port = cluster[2].rsplit(":", 1)
    for junk in (
        b"GET /health HTTP/1.1\r\n\r\n",
        os.urandom(4096),
        framing.pack_header(1, 1 << 30),
    ):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(junk)
            assert _closed_by_peer(sock)  # a stream out of sync is dropped
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        assert _request(sock, W.Call("get", ["k"])).code == -600  # not attached
        assert _request(sock, W.Attach(os.getpid())).code == 0
        bad = [
            W.Call("shutdown", ["k"]),
            W.Call("put", ["k"], [(0, 0, 10)]),  # no such segment
            W.Call("get", ["k"] * (W.MAX_KEYS + 1)),
            W.MapSeg(1, "../../etc/passwd", 4096),
            W.MapSeg(1, "kvcake-dummy-1-0-0", 4096),  # no such file
            W.UnmapSeg(5),
        ]
        assert [_request(sock, m).code for m in bad] == [-600] * len(bad)
        assert _request(sock, W.Ping()).code == 0  # the connection itself goes on
    assert cluster[1].popen.poll() is None
    assert dummy.put("after-garbage", b"ok") == 0 and dummy.get("after-garbage") == b"ok"


def test_at_most_max_sessions_dummies(
    cluster: tuple[str, Prog, str], dummy: MooncakeDistributedStore
) -> None:
    host, port = cluster[2].rsplit(":", 1)
    socks: list[socket.socket] = []
    try:
        refused = W.Reply()
        for _ in range(W.MAX_SESSIONS):  # the fixture's dummy holds one place already
            sock = socket.create_connection((host, int(port)), timeout=10)
            socks.append(sock)
            refused = _request(sock, W.Attach(os.getpid()))
            if refused.code:
                break
        assert refused.code == -1 and "too many" in refused.message
        assert len(socks) <= W.MAX_SESSIONS and _closed_by_peer(socks[-1])
    finally:
        for sock in socks:
            sock.close()
    deadline = time.monotonic() + 10
    again = MooncakeDistributedStore()
    while again.setup_dummy(64 * MB, MB, cluster[2]) and time.monotonic() < deadline:
        time.sleep(0.1)  # the places come free as the server sees the closes
    assert again.put("again", b"1") == 0 and again.close() == 0


DUMMY_SCRIPT = """
import ctypes, sys
from kvcake.compat.mooncake import MooncakeDistributedStore
s = MooncakeDistributedStore()
assert s.setup_dummy(64 << 20, 4 << 20, sys.argv[1]) == 0
p = s.alloc_from_mem_pool(8 << 20)
assert s.register_buffer(p, 8 << 20) == 0 and s.put("vanishing", b"x" * 100) == 0
print("ready", flush=True)
sys.stdin.read()
"""


def _dummy_maps(pid: int, dummy_pid: int) -> set[str]:
    """Names of the dummy's shared-memory files mapped in process ``pid``."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return set(re.findall(rf"kvcake-dummy-{dummy_pid}-[0-9a-f]+-[0-9]+", maps))


def test_a_vanished_dummy_is_freed(cluster: tuple[str, Prog, str]) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", DUMMY_SCRIPT, cluster[2]],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        real = cluster[1].popen.pid
        assert len(_dummy_maps(real, child.pid)) == 2  # its local buffer and its 8 MiB block
        assert not list(Path("/dev/shm").glob(f"kvcake-dummy-{child.pid}-*"))  # unlinked
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        deadline = time.monotonic() + 10
        while _dummy_maps(real, child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _dummy_maps(real, child.pid) == set()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def _attach(
    address: str, deadline_s: str, monkeypatch: pytest.MonkeyPatch
) -> MooncakeDistributedStore:
    monkeypatch.setenv("KVCAKE_DUMMY_CALL_S", deadline_s)  # read when the dummy attaches
    store = MooncakeDistributedStore()
    assert store.setup_dummy(64 * MB, 4 * MB, address) == 0
    return store


def _stop(pid: int) -> None:
    """SIGSTOP, then wait until every thread of ``pid`` has stopped (a thread can still finish
    a request in the moment after the signal)."""
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:
        states = [
            p.read_text().rsplit(")", 1)[1].split()[0]
            for p in Path(f"/proc/{pid}/task").glob("*/stat")
        ]
        return bool(states) and all(st in "tT" for st in states)

    wait_until(stopped, timeout=10, every_s=0.01, what=f"every thread of {pid} stopped")


def test_real_client_hung_or_killed_mid_call(
    bin_dir: Path, cluster: tuple[str, Prog, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, address = start_client(bin_dir, cluster[0])
    hasty = _attach(address, "1.5", monkeypatch)
    patient = _attach(address, "60", monkeypatch)
    try:
        assert hasty.put("kk", b"v" * 100) == 0 and patient.get("kk") == b"v" * 100
        _stop(client.popen.pid)  # hung: the call deadline answers
        t0 = time.monotonic()
        assert hasty.put("k2", b"x") == -900
        assert 1.0 < time.monotonic() - t0 < 5
        got: list[object] = []
        waiting = threading.Thread(target=lambda: got.append(patient.get_size("kk")))
        waiting.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        os.kill(client.popen.pid, signal.SIGKILL)  # killed while the call waits for it
        waiting.join(10)
        assert got == [-900] and time.monotonic() - t0 < 3
        for s in (hasty, patient):  # then every call fails at once, with the wheel's answers
            t0 = time.monotonic()
            assert (s.get("kk"), s.is_exist("kk"), s.get_size("kk"), s.remove("kk")) == (
                b"", -900, -900, -900,
            )  # fmt: skip
            assert (s.batch_is_exist(["kk", "a"]), s.get_batch(["kk"])) == ([-1, -1], [b""])
            assert (s.put_batch(["a"], [b"b"]), s.health_check()) == (-900, 2)
            assert time.monotonic() - t0 < 1 and s.close() == 0
    finally:
        os.kill(client.popen.pid, signal.SIGKILL)
        client.stop()


def test_port_flags() -> None:
    from kvcake.compat.mooncake.real_client_flags import parse

    plain = parse(["--port=1234", "--http_port=9999"])
    assert (plain.port, plain.store.http_port) == (1234, 0)  # HTTP on a free port
    served = parse(["--port=1234", "--enable_http_server=true", "--http_port=9999"])
    assert (served.port, served.store.http_port) == (1234, 9999)


def test_a_busy_port_exits_2(bin_dir: Path, cluster: tuple[str, Prog, str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        client = Prog(
            str(bin_dir / "mooncake_client"), f"--master_server_address={cluster[0]}",
            f"--port={port}", "--global_segment_size=16MB",
        )  # fmt: skip
        try:
            assert client.done(60) == 2
        finally:
            client.stop()
    assert any(f"cannot listen on 127.0.0.1:{port}" in line for line in client.err)


def test_a_request_cut_off_midway_is_dropped(bin_dir: Path, cluster: tuple[str, Prog, str]) -> None:
    client, address = start_client(bin_dir, cluster[0], {"KVCAKE_DUMMY_FRAME_S": "1"})
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as idle:
            assert _request(idle, W.Attach(os.getpid())).code == 0
            with socket.create_connection((host, int(port)), timeout=10) as stalled:
                stalled.sendall(framing.pack_header(1, 100)[:10])  # then nothing
                t0 = time.monotonic()
                assert _closed_by_peer(stalled) and 0.5 < time.monotonic() - t0 < 5
            time.sleep(1.5)  # an idle dummy has no deadline between requests
            assert _request(idle, W.Ping()).code == 0
    finally:
        client.stop()


def test_bytes_changed_on_the_last_hop_are_refused(
    cluster: tuple[str, Prog, str], dummy: MooncakeDistributedStore, monkeypatch
) -> None:
    """issue 30: the real client verified what it read from the pool; the dummy checks what
    reached it through shared memory (and the reply frame) against the object's checksums, and
    its puts carry sums of its own bytes, so a value changed on the way is never served."""
    remote = dummy._conn.client
    real_rpc = remote._rpc
    value = np.random.default_rng(5).bytes(6000)
    assert dummy.put("hop", value) == 0 and dummy.get("hop") == value
    ptr = dummy.alloc_from_mem_pool(MB)
    assert dummy.register_buffer(ptr, MB) == 0

    def corrupt_local_after(msg: object) -> tuple[W.Reply, bytes]:
        reply, data = real_rpc(msg)
        if isinstance(msg, W.Call) and msg.op in ("get", "get_into"):
            remote._local_view(0, 1)[0] ^= 0xFF  # where a value lands in the local buffer
            ctypes.memset(ptr, 0x55, 1)  # a registered destination, written in place
        return reply, data

    monkeypatch.setattr(remote, "_rpc", corrupt_local_after)
    assert dummy.get("hop") == b""  # an error: Mooncake's get answers b""
    assert dummy.get_into("hop", ptr, MB) == -801  # CHECKSUM_MISMATCH
    monkeypatch.setattr(remote, "_rpc", real_rpc)
    assert dummy.get("hop") == value  # the pool's copy was never bad

    def corrupt_local_before(msg: object) -> tuple[W.Reply, bytes]:
        if isinstance(msg, W.Call) and msg.op == "put":
            remote._local_view(0, 1)[0] ^= 0xFF  # after the dummy summed and staged it
        return real_rpc(msg)

    monkeypatch.setattr(remote, "_rpc", corrupt_local_before)
    assert dummy.put("hop2", value) == 0  # the master keeps the dummy's sums...
    monkeypatch.setattr(remote, "_rpc", real_rpc)
    assert dummy.get("hop2") == b""  # ...which the bytes that arrived do not match
    normal = MooncakeDistributedStore()
    assert normal.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 * MB, "tcp", "", cluster[0]) == 0
    try:
        assert normal.get("hop2") == b"" and normal.get("hop") == value
    finally:
        normal.close()
