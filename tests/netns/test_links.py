"""The harness's links themselves: hosts reach each other only over the bridge, ``tbf`` caps a
host's egress, a partition drops packets silently, the relay delays without losing bytes."""

from __future__ import annotations

import hashlib
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from kvcake.launch.netns import Network

SINK = r"""
import hashlib, socket, sys, time
s = socket.create_server((sys.argv[1], 0)); print(s.getsockname()[1], flush=True)
c, _ = s.accept(); n = 0; t0 = None; h = hashlib.sha256()
while d := c.recv(1 << 16):
    t0 = t0 or time.monotonic(); n += len(d); h.update(d)
c.sendall(f"{n} {time.monotonic() - t0:.4f} {h.hexdigest()}".encode()); c.close()
"""


@pytest.fixture
def net() -> Iterator[Network]:
    with Network(["a", "b"]) as n:
        yield n
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert n.tag not in names


def _sink(net: Network) -> tuple[subprocess.Popen[str], int]:
    p = subprocess.Popen(net.command("b", [sys.executable, "-c", SINK, net["b"].addr]),
                         stdout=subprocess.PIPE, text=True, env=net.env())  # fmt: skip
    assert p.stdout is not None
    return p, int(p.stdout.readline())


def _send(net: Network, port: int, nbytes: int) -> tuple[int, float]:
    with net.inside("a"):
        s = socket.create_connection((net["b"].addr, port), timeout=30)
    with s:
        s.sendall(b"x" * nbytes)
        s.shutdown(socket.SHUT_WR)
        got, secs, _ = s.recv(200).decode().split()
    return int(got), float(secs)


@pytest.mark.timeout(120)
def test_tbf_caps_a_hosts_egress(net: Network) -> None:
    net.limit("a", "40mbit", burst="64kb")
    p, port = _sink(net)
    got, secs = _send(net, port, 4 << 20)  # 4 MiB at 40 Mbit/s: >= 0.8 s
    p.wait(30)
    assert got == 4 << 20
    assert got * 8 / secs < 48e6, f"{got * 8 / secs / 1e6:.1f} Mbit/s over a 40 Mbit/s cap"


@pytest.mark.timeout(120)
def test_hosts_are_isolated_and_partition_is_silent(net: Network) -> None:
    # no route anywhere but the bridge (and 127.0.0.1 in a namespace is that host's own)
    with net.inside("a"), pytest.raises(OSError):
        socket.create_connection(("10.199.1.1", 80), timeout=1)
    p, port = _sink(net)
    net.partition("b")
    t = time.monotonic()
    with net.inside("a"), pytest.raises(OSError):  # dropped, not refused: a timeout
        socket.create_connection((net["b"].addr, port), timeout=2)
    assert time.monotonic() - t >= 1.5
    net.heal("b")
    assert _send(net, port, 1000)[0] == 1000
    p.wait(30)


@pytest.mark.timeout(120)
def test_relay_delays_each_direction_and_keeps_every_byte(net: Network) -> None:
    p, port = _sink(net)
    relay = subprocess.Popen(
        net.command("b", [sys.executable, "-m", "kvcake", "netns-relay", "--delay-ms", "50",
                          "--route", f"{net['b'].addr}:0={net['b'].addr}:{port}"]),
        stdout=subprocess.PIPE, text=True, env=net.env(),
    )  # fmt: skip
    try:
        assert relay.stdout is not None
        line = relay.stdout.readline()
        rport = int(line.split()[2].rsplit(":", 1)[1])
        data = random.Random(1).randbytes(3 << 20)
        with net.inside("a"):
            s = socket.create_connection((net["b"].addr, rport), timeout=30)
        t = time.monotonic()
        out = threading.Thread(target=lambda: (s.sendall(data), s.shutdown(socket.SHUT_WR)))
        out.start()
        reply = s.recv(200).decode()
        rtt = time.monotonic() - t
        out.join(10)
        s.close()
        got, _, digest = reply.split()
        assert int(got) == len(data) and digest == hashlib.sha256(data).hexdigest()
        assert rtt >= 0.1, rtt  # 50 ms there (the last chunk) + 50 ms back
    finally:
        relay.terminate()
        relay.wait(10)
        p.wait(30)
