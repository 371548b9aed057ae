"""Free TCP ports for servers started with an explicit port (etcd, vLLM engines, HA masters).

A port the kernel hands out for port 0 comes from its ephemeral range, and any client socket
on the machine may take it again between the check and the server's bind: a test cluster lost
its port that way in a fresh-clone run. Ports here come from below that range, where only an
explicit bind takes one, and each is handed out once per process (the record of handed-out
ports is bounded). Candidates are drawn unseeded, so two processes starting at once do not try
the same sequence.
"""

from __future__ import annotations

import collections
import random
import socket
import threading

BELOW = 12_000  # candidates come from this many ports under the ephemeral range
REMEMBERED = 4096  # handed-out ports remembered (oldest forgotten first)

_rng = random.Random()
_lock = threading.Lock()
_given: collections.deque[range] = collections.deque(maxlen=REMEMBERED)


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default when unreadable)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(n: int, span: int = 0, host: str = "127.0.0.1") -> list[int]:
    """``n`` free ports on ``host``, none handed out before by this process. With ``span``,
    every port up to ``port + span`` is kept out of later answers and ``port + span`` is free
    too (a cluster's decode instance listens at its base port + 50)."""
    if n < 0 or span < 0:
        raise ValueError(f"need n >= 0 and span >= 0, got {n}, {span}")
    top = ephemeral_start() - span - 1
    bottom = max(1024, top - BELOW)
    ports: list[int] = []
    with _lock:
        for _ in range(20 * BELOW):
            if len(ports) == n:
                return ports
            p = _rng.randrange(bottom, top)
            if any(r.start <= p + span and p < r.stop for r in _given):
                continue  # overlaps a port (or span) handed out before
            if bindable(p, host) and (not span or bindable(p + span, host)):
                ports.append(p)
                _given.append(range(p, p + span + 1))
    raise RuntimeError(f"found only {len(ports)} of {n} free ports between {bottom} and {top}")


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host=host)[0]
