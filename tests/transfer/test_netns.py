"""A real link goes down: a target process in a network namespace reachable over two veth
links; one link is downed mid-transfer; every byte must still arrive over the other.
Skipped (with the reason) where the machine forbids ``ip netns``."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from kvcake.core.ids import SegmentName
from kvcake.transfer import DirectoryService, Op, TransferConfig, TransferEngine, TransferRequest

from .conftest import ServerProc, pattern

S = SegmentName
N = os.getpid() % 10000
NS = f"kvcake-t{N}"
LINKS = [(f"kvta{N}", f"kvtA{N}", "10.213.1"), (f"kvtb{N}", f"kvtB{N}", "10.213.2")]
SIZE = 32 << 20


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def netns_forbidden() -> str | None:
    if shutil.which("ip") is None:
        return "no `ip` command"
    if os.geteuid() != 0:
        return "needs root for ip netns"
    probe = f"kvcake-probe{N}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add` not permitted here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@pytest.fixture
def netns(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    reason = netns_forbidden()
    if reason:
        pytest.skip(reason)
    # Namespace addresses are not loopback: every server needs the shared secret (issue 15 §3).
    monkeypatch.setenv("KVCAKE_AUTH_SECRET", "netns-test-secret-0123456789")
    try:
        sh("ip", "netns", "add", NS)
        sh("ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up")
        for host_if, ns_if, net in LINKS:
            sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            sh("ip", "link", "set", ns_if, "netns", NS)
            sh("ip", "addr", "add", f"{net}.1/24", "dev", host_if)
            sh("ip", "link", "set", host_if, "up")
            sh("ip", "netns", "exec", NS, "ip", "addr", "add", f"{net}.2/24", "dev", ns_if)
            sh("ip", "netns", "exec", NS, "ip", "link", "set", ns_if, "up")
        yield
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)  # removes both veths
        for host_if, _, _ in LINKS:
            subprocess.run(["ip", "link", "del", host_if], capture_output=True)


@pytest.mark.slow
def test_veth_link_down_mid_transfer(netns: None) -> None:
    svc = DirectoryService(f"{LINKS[1][2]}.1", 0)  # reached over link B, which stays up
    svc.start()
    srv = ServerProc(
        [
            "--directory",
            svc.address,
            "--listen-hosts",
            f"{LINKS[0][2]}.2,{LINKS[1][2]}.2",
            "--segment",
            f"remote:{SIZE}",
            "--memory",
            "heap",
            "--io-timeout-s",
            "2",
        ],
        prefix=["ip", "netns", "exec", NS],
    )
    cfg = TransferConfig(
        slice_size=256 << 10,
        lane_bytes=1 << 20,
        streams=2,
        window=2,
        io_timeout_s=1.0,
        connect_timeout_s=1.0,
        probe_interval_s=0.2,
    )
    engine = TransferEngine(svc.address, protocol="tcp", config=cfg)
    try:
        src = pattern(SIZE, seed=40)
        engine.register_memory("src", src)
        link_a = next(a for a in srv.info["addresses"] if a.startswith(LINKS[0][2]))
        downed = threading.Event()

        def hook(addr: str, n: int) -> None:
            if addr == link_a and n == 8 and not downed.is_set():
                downed.set()
                sh("ip", "link", "set", LINKS[0][0], "down")

        engine.hooks.after_send = hook
        reqs = [
            TransferRequest(Op.WRITE, S("src"), o, S("remote"), o, 1 << 20)
            for o in range(0, SIZE, 1 << 20)
        ]
        res = engine.wait(engine.submit(reqs), 60)
        assert downed.is_set()
        assert res.ok, res
        assert link_a in engine.health.down()
        engine.hooks.after_send = None
        back = bytearray(SIZE)
        engine.read_into("remote", 0, back)  # over link B only
        assert hashlib.sha256(back).digest() == hashlib.sha256(src).digest()
        sh("ip", "link", "set", LINKS[0][0], "up")  # the link heals: a probe brings it back
        deadline = time.monotonic() + 10
        while link_a in engine.health.down() and time.monotonic() < deadline:
            engine.read_into("remote", 0, bytearray(4096))
            time.sleep(0.05)
        assert link_a not in engine.health.down()
    finally:
        engine.close()
        assert srv.stop() == 0
        svc.stop()
