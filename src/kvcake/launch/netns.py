"""Emulated hosts for a multi-host cluster on one machine: Linux network namespaces.

:class:`Network` creates one namespace per "host" (``kvc-<pid>-<hex>-<role>``), a switch
namespace holding a bridge, and a veth pair from each host to the bridge, with addresses of
``10.199.0.0/24`` that exist only inside these namespaces: no default route, no NAT, nothing
joined to the machine's own interfaces, so no packet leaves the machine. Each process of a host
runs under :meth:`Network.command`: ``ip netns exec`` (its network), ``unshare --uts`` with the
host's own hostname (so the Transfer Engine's host identity differs from every other host's and
it never picks shared memory) and a private tmpfs on ``/dev/shm`` (so no host can map another's
segments even by accident): everything between hosts crosses real TCP.

Links: :meth:`Network.limit` puts a ``tbf`` qdisc (this kernel has no ``netem``) on a host's
egress; :meth:`partition` / :meth:`heal` take its switch port down / up (packets are dropped, no
reset is sent: peers see a silent host). Latency comes from :mod:`kvcake.launch.netns_relay`.

Requires root (CAP_SYS_ADMIN + CAP_NET_ADMIN), ``ip`` (iproute2), ``unshare`` (util-linux) and
``tc``; :func:`unavailable` says why not, for tests to skip with. Cleanup: :meth:`Network.close`
(also registered with ``atexit``) kills what still runs in the namespaces and deletes them;
:func:`remove_stale` removes namespaces left by a dead harness process.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from kvcake.core.errors import KvcakeError

PREFIX = "kvc-"
SUBNET = "10.199.0"  # /24, only ever inside namespaces this module creates
CLONE_NEWNET = 0x40000000
SHM_SIZE = "2g"  # each host's private /dev/shm (tmpfs: only what is used counts)
_SETUP = (
    'hostname "$0" && mount -t tmpfs -o size=$KVCAKE_NETNS_SHM kvcake-shm /dev/shm && exec "$@"'
)


class NetnsError(KvcakeError):
    """A namespace, link or qdisc could not be set up (the message has the command)."""


def unavailable() -> str:
    """Why namespaces cannot be used here ("" = they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns, unshare, tc)"
    for tool in ("ip", "unshare", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2 / util-linux)"
    name = f"{PREFIX}{os.getpid()}-probe{secrets.token_hex(2)}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ""


def sh(*argv: str) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


@dataclass(frozen=True)
class Host:
    role: str  # "master", "store-0", "prefill-1", ... (also its hostname's suffix)
    ns: str  # namespace name
    addr: str  # its address on the bridge
    port: str  # its veth end in the switch namespace (what partition() takes down)

    @property
    def hostname(self) -> str:
        return f"kvc-{self.role}"


class Network:
    """Namespaces for ``roles`` on one bridge. Use as a context manager."""

    def __init__(self, roles: list[str]):
        if len(set(roles)) != len(roles) or len(roles) > 200:
            raise NetnsError(f"roles must be unique and at most 200: {roles}")
        for r in roles:
            if not re.fullmatch(r"[a-z0-9-]{1,20}", r):
                raise NetnsError(f"role {r!r}: use 1-20 of [a-z0-9-]")
        self.tag = f"{PREFIX}{os.getpid()}-{secrets.token_hex(2)}"
        self.switch = f"{self.tag}-sw"
        self.hosts = {
            r: Host(r, f"{self.tag}-{r}", f"{SUBNET}.{10 + i}", f"v{i}")
            for i, r in enumerate(roles)
        }
        self._made: list[str] = []
        self._closed = False
        atexit.register(self.close)

    def __enter__(self) -> Network:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, role: str) -> Host:
        return self.hosts[role]

    def create(self) -> None:
        try:
            self._add_ns(self.switch)
            sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", self.switch, "link", "set", "br0", "up")
            for h in self.hosts.values():
                self._add_host(h)
        except BaseException:
            self.close()
            raise

    def _add_ns(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self._made.append(name)
        sh("ip", "-n", name, "link", "set", "lo", "up")

    def _add_host(self, h: Host) -> None:
        self._add_ns(h.ns)
        sw = self.switch
        sh("ip", "-n", sw, "link", "add", h.port, "type", "veth", "peer", "name", "eth0",
           "netns", h.ns)  # fmt: skip
        sh("ip", "-n", sw, "link", "set", h.port, "master", "br0", "up")
        sh("ip", "-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", "eth0")
        sh("ip", "-n", h.ns, "link", "set", "eth0", "up")

    # --- links --------------------------------------------------------------------------------
    def limit(self, role: str, rate: str, burst: str = "1mb") -> None:
        """Cap ``role``'s egress at ``rate`` (tc syntax: "100mbit", "1gbit") with ``tbf``."""
        ns = self.hosts[role].ns
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
           "rate", rate, "burst", burst, "latency", "200ms")  # fmt: skip

    def partition(self, role: str) -> None:
        """Cut ``role`` off: its switch port goes down, every packet to or from it is lost."""
        sh("ip", "-n", self.switch, "link", "set", self.hosts[role].port, "down")

    def heal(self, role: str) -> None:
        sh("ip", "-n", self.switch, "link", "set", self.hosts[role].port, "up")

    # --- processes ----------------------------------------------------------------------------
    def command(self, role: str, argv: list[str]) -> list[str]:
        """``argv`` run on host ``role`` (its network, hostname and ``/dev/shm``). The chain
        execs, so the returned command's pid is ``argv``'s process."""
        h = self.hosts[role]
        return ["ip", "netns", "exec", h.ns, "unshare", "--uts", "sh", "-c", _SETUP,
                h.hostname, *argv]  # fmt: skip

    def env(self) -> dict[str, str]:
        return {"KVCAKE_NETNS_SHM": SHM_SIZE}

    @contextlib.contextmanager
    def inside(self, role: str) -> Iterator[None]:
        """Sockets the *calling thread* opens in this block live on host ``role`` (setns on
        this thread only; other threads are untouched). For short client calls in tests."""
        with enter_netns(self.hosts[role].ns):
            yield

    def close(self) -> None:
        """Kill every process still in these namespaces, then delete them. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for name in reversed(self._made):
            _delete_ns(name)
        self._made.clear()
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)


@contextlib.contextmanager
def enter_netns(ns: str) -> Iterator[None]:
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            if libc.setns(target, CLONE_NEWNET) != 0:
                raise NetnsError(f"setns({ns}): {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(target)
        try:
            yield
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:  # never leave the thread elsewhere
                raise NetnsError(f"setns back: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(own)


def _delete_ns(name: str) -> None:
    r = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    for pid in r.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def remove_stale() -> list[str]:
    """Delete ``kvc-<pid>-...`` namespaces whose creating process is gone; returns them."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    gone = []
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{PREFIX}(\d+)-.*", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            _delete_ns(name)
            gone.append(name)
    return gone
