"""Ports for servers a test starts with an explicit port (etcd, vLLM, a cluster file).

Ports come from below the kernel's ephemeral range: a port the kernel handed out for port 0
can be taken again by any client socket of the suite between the check and the server's bind
(``test_cluster_section_sets_every_port`` failed a fresh-clone run that way); below the range
only an explicit bind can take it. Each port is handed out once per test process.
"""

from __future__ import annotations

import random
import socket

_RNG = random.Random(0)  # seeded; a taken candidate is skipped
_GIVEN: set[int] = set()


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except OSError:
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int, span: int = 0) -> list[int]:
    """``n`` free ports, none handed out before; with ``span``, ``port + span`` is free too
    and no two ports are within ``span`` of each other (a cluster's decode instance listens
    at its base port + 50)."""
    top = _ephemeral_start() - span - 1
    bottom = max(1024, top - 12_000)
    ports: list[int] = []
    for _ in range(100_000):
        if len(ports) == n:
            return ports
        p = _RNG.randrange(bottom, top)
        near = [q for q in (*_GIVEN, *ports) if abs(p - q) <= span]
        if not near and _bindable(p) and (not span or _bindable(p + span)):
            ports.append(p)
            _GIVEN.update(range(p, p + span + 1) if span else (p,))
    raise RuntimeError(f"no {n} free ports below {top}")


def free_port() -> int:
    return free_ports(1)[0]
