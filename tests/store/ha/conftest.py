"""Fixtures of the HA tests: a real etcd (Debian's etcd-server, `make etcd`) on free loopback
ports, and a TCP relay in front of it that a test can cut (a master "cut off from etcd")."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from kvcake.core.ports import free_port
from kvcake.store.ha.election import read_leader
from kvcake.store.ha.etcd import Etcd
from tests.store.ha.gated import GatedLog
from tests.store.procs import Proc, spawn
from tests.waits import wait_until


@dataclass
class EtcdServer:
    url: str
    popen: subprocess.Popen[bytes]

    @property
    def hostport(self) -> str:
        return self.url.removeprefix("http://")


def start_etcd(data_dir: str) -> EtcdServer:
    exe = shutil.which("etcd")
    if exe is None:
        pytest.skip("etcd is not installed (make etcd, or apt-get install etcd-server)")
    for _ in range(3):
        client, peer = free_port(), free_port()
        url = f"http://127.0.0.1:{client}"
        popen = subprocess.Popen(
            [exe, "--name", "t", "--data-dir", data_dir, "--listen-client-urls", url,
             "--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"t=http://127.0.0.1:{peer}", "--log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and popen.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.post(url + "/v3/kv/range", json={"key": "eA=="}, timeout=1).is_success:
                    return EtcdServer(url, popen)
            time.sleep(0.1)
        popen.kill()
        popen.wait(5)
    raise RuntimeError("etcd did not start")


@pytest.fixture(scope="session")
def etcd() -> Iterator[EtcdServer]:
    """One etcd for the session; tests keep apart by a cluster name of their own."""
    with tempfile.TemporaryDirectory(prefix="kvcake-etcd-") as data:
        server = start_etcd(data)
        yield server
        server.popen.terminate()
        try:
            server.popen.wait(10)
        except subprocess.TimeoutExpired:
            server.popen.kill()
            server.popen.wait(5)


class Relay:
    """Forwards 127.0.0.1:<port> to ``target``; :meth:`cut` drops every connection and stops
    accepting (the process behind it is then cut off), :meth:`close` ends it."""

    def __init__(self, target: str):
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.open = True
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                a, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                if not self.open:
                    a.close()
                    continue
                try:
                    b = socket.create_connection(self.target, timeout=5)
                except OSError:
                    a.close()
                    continue
                self.conns += [a, b]
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self.lock:
            self.open = False
            for s in self.conns:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self.conns.clear()

    def close(self) -> None:
        self.cut()
        self.sock.close()


def spawn_master(etcd_url: str, cluster: str, *extra: str) -> Proc:
    return spawn(
        "master", "--etcd-endpoints", etcd_url, "--cluster", cluster, "--port", "0",
        "--http-port", "-1", "--client-ttl-s", "3", *extra, ready="master standby",
    )  # fmt: skip


def leader_proc(etcd: Etcd, cluster: str, masters: list[Proc], timeout: float = 30) -> Proc:
    """The master process the leader key names (once it serves)."""

    def named() -> Proc | None:
        info = read_leader(etcd, cluster)
        if info is None or not info.rpc:
            return None
        pid = int(info.name.rsplit("/", 1)[1])
        return next((m for m in masters if m.popen.pid == pid), None)

    return wait_until(named, timeout=timeout, what="a leader among the masters")


def wait_line(proc: Proc, prefix: str, start: int = 0, timeout: float = 30) -> str:
    return wait_until(
        lambda: next((ln for ln in proc.lines[start:] if ln.startswith(prefix)), ""),
        timeout=timeout, what=f"a {prefix!r} line", detail=lambda: "".join(proc.lines),
    )  # fmt: skip


@pytest.fixture
def oplog() -> Iterator[GatedLog]:
    log = GatedLog()
    log.load()
    yield log
    log.gate.set()
    log.close()
