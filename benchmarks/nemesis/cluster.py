"""The processes of one nemesis run: etcd, the HA masters (``m0``-``m2``), the storage nodes
(``s0``...), the client processes (``c0``...), each on its own host (:mod:`.hosts`); starting,
restarting (a new incarnation, a new log), who leads, and the masters' eviction counters."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from benchmarks.nemesis.hosts import Hosts

from kvcake.core.ports import free_port
from kvcake.core.promtext import find, parse_metrics
from kvcake.launch.child import die_with_parent
from kvcake.launch.ha_pool import LEADER, etcd_alive

CLUSTER = "nemesis"


@dataclass
class Proc:
    name: str  # m0, s1, c2, etcd (also its host's role)
    kind: str  # master | store | worker | etcd
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    incarnation: int = 0
    paused: bool = False
    logs: list[Path] = field(default_factory=list)  # every incarnation's

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, sig)

    def text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())


@dataclass
class Settings:
    masters: int = 3
    stores: int = 2
    workers: int = 3
    keys: int = 16  # per worker
    segment: str = "64MiB"
    client_ttl_s: float = 10.0
    lease_ttl_s: float = 0.3  # reads lease objects; upserts and removes refuse leased ones
    rpc_timeout_s: float = 3.0
    pace_s: float = 0.02
    seed: int = 0


class Cluster:
    """etcd, the masters, the storage nodes and the workers of one schedule."""

    def __init__(self, s: Settings, run: Path, netns: bool):
        self.s, self.run = s, run
        self.masters = [f"m{i}" for i in range(s.masters)]
        self.stores = [f"s{i}" for i in range(s.stores)]
        self.workers = [f"c{i}" for i in range(s.workers)]
        self.hosts = Hosts(["etcd", *self.masters, *self.stores, *self.workers], netns)
        self.secret = secrets.token_hex(16)
        self.procs: dict[str, Proc] = {}
        self.etcd_url = ""
        self.evicted: dict[str, int] = {}  # master log -> its highest evicted_objects seen
        self.scrapes = 0  # successful reads of a master's /metrics
        self._http_auth: object = None

    # --- start / stop ---------------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        self.run.mkdir(parents=True, exist_ok=True)
        self.hosts.__enter__()
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def master_addr(self) -> str:
        return f"etcd://{self.etcd_url.removeprefix('http://')}/{CLUSTER}"

    def _start(self) -> None:
        self._start_etcd()
        for m in self.masters:
            a = self.hosts.addr(m)
            self.add(m, "master", ["master", "--host", a, "--port", "0", "--http-port", "0",
                                   "--etcd-endpoints", self.etcd_url, "--cluster", CLUSTER,
                                   "--client-ttl-s", str(self.s.client_ttl_s),
                                   "--lease-ttl-s", str(self.s.lease_ttl_s)])  # fmt: skip
        self.start_all(self.masters, "master standby")
        self.wait(lambda: self.leader() is not None, 60, "no leader was elected")
        for n in self.stores:
            self.add(n, "store", ["store-server", "--master", self.master_addr, "--hostname",
                                  self.hosts.addr(n), "--segment-size", self.s.segment,
                                  "--name", n, "--http-port", "-1"])  # fmt: skip
        self.start_all(self.stores, "store-server")
        for w in self.workers:
            self.add(w, "worker", self.worker_argv(w))
        self.start_all(self.workers, "worker ready")

    def start_all(self, names: list[str], ready: str) -> None:
        """Start several processes at once (imports overlap), then wait for each."""
        for n in names:
            self.start(self.procs[n])
        for n in names:
            self.wait_ready(self.procs[n], ready)

    def _start_etcd(self) -> None:
        a = self.hosts.addr("etcd")
        port, peer = (2379, 2380) if self.hosts.net is not None else (free_port(), free_port())
        self.etcd_url = url = f"http://{a}:{port}"
        purl = f"http://{a}:{peer}"
        exe = shutil.which("etcd")
        if exe is None:
            raise RuntimeError("etcd is not installed (make etcd)")
        argv = [exe, "--name", "n", "--data-dir", str(self.run / "etcd-data"),
                "--listen-client-urls", url, "--advertise-client-urls", url,
                "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                "--initial-cluster", f"n={purl}", "--log-level", "warn"]  # fmt: skip
        self.start(self.add("etcd", "etcd", argv, raw=True))

        def up() -> bool:
            with self.hosts.inside("etcd"):
                return etcd_alive(url)

        self.wait(up, 30, "etcd did not start")

    def worker_argv(self, w: str, final: bool = False) -> list[str]:
        s = self.s
        out = self.run / ("final.jsonl" if final else f"hist-{w}.jsonl")
        argv = [sys.executable, "-m", "benchmarks.nemesis.worker", "--master", self.master_addr,
                "--hostname", self.hosts.addr(w), "--name", w, "--seed", str(s.seed),
                "--workers", ",".join(self.workers), "--keys", str(s.keys),
                "--pace-s", str(s.pace_s), "--rpc-timeout-s", str(s.rpc_timeout_s),
                "--out", str(out)]  # fmt: skip
        return [*argv, "--final"] if final else argv

    def add(self, name: str, kind: str, args: list[str], raw: bool = False) -> Proc:
        argv = args if raw or kind == "worker" else [sys.executable, "-m", "kvcake", *args]
        p = self.procs[name] = Proc(name, kind, argv, self.run / f"{name}.log")
        return p

    def start(self, p: Proc) -> None:
        """(Re)start ``p`` as its next incarnation (a worker learns its number)."""
        p.incarnation += 1
        p.paused = False
        p.log = self.run / f"{p.name}.{p.incarnation}.log"
        p.logs.append(p.log)
        argv = list(p.argv)
        if p.kind == "worker":
            argv += ["--incarnation", str(p.incarnation)]
        with p.log.open("wb") as fh:
            p.popen = subprocess.Popen(
                self.hosts.command(p.name, argv), stdout=fh, stderr=subprocess.STDOUT,
                env=self.hosts.env(self.secret), start_new_session=True,
                preexec_fn=die_with_parent,
            )  # fmt: skip

    def stores_down(self) -> list[str]:
        """Storage nodes not serving at the end: exited, or never ready since their last
        (re)start -- a restarted node that did not get its name back (docs/store.md, "A
        restarted node"). The run goes on without them (a killed node counts as dead)."""
        return [n for n in self.stores
                if self.procs[n].popen is None or self.procs[n].popen.poll() is not None
                or "store-server segment=" not in self.procs[n].log.read_text(errors="replace")]  # fmt: skip

    def wait_ready(self, p: Proc, ready: str, timeout: float = 120) -> None:
        self.wait(lambda: ready in p.log.read_text(errors="replace"), timeout,
                  f"{p.name} did not start", p)  # fmt: skip

    def wait(self, cond: object, timeout: float, what: str, p: Proc | None = None) -> None:
        deadline = time.monotonic() + timeout
        while not cond():  # type: ignore[operator]
            if p is not None and not p.alive():
                raise RuntimeError(f"{what}: it exited\n{p.text()[-3000:]}")
            if time.monotonic() > deadline:
                tail = p.text()[-3000:] if p is not None else ""
                raise RuntimeError(f"{what} within {timeout:.0f} s\n{tail}")
            time.sleep(0.1)

    def close(self) -> None:
        """SIGCONT and SIGTERM everything (etcd last), SIGKILL what lingers, remove hosts."""
        self.hosts.heal()
        order = [p for p in self.procs.values() if p.kind != "etcd"]
        order += [p for p in self.procs.values() if p.kind == "etcd"]
        for group in (order[:-1], order[-1:]):
            for p in group:
                p.signal(signal.SIGCONT)
                p.signal(signal.SIGTERM)
            for p in group:
                if p.popen is not None:
                    try:
                        p.popen.wait(10)
                    except subprocess.TimeoutExpired:
                        p.signal(signal.SIGKILL)
                        p.popen.wait(5)
        self.hosts.__exit__()

    # --- state ------------------------------------------------------------------------------------
    def leader(self) -> Proc | None:
        """The live master whose log shows the highest term (None while nobody leads)."""
        best, who = -1, None
        for m in self.masters:
            p = self.procs[m]
            for log in p.logs:
                for hit in LEADER.finditer(log.read_text(errors="replace")):
                    if int(hit["term"]) > best:
                        best, who = int(hit["term"]), (p if log == p.log else None)
        return who if who is not None and who.alive() else None

    def http_auth(self) -> Any:
        """Signed requests for the masters' HTTP (non-loopback binds need the secret)."""
        if self.hosts.net is None:
            return None
        if self._http_auth is None:
            from kvcake.core.auth import load_auth
            from kvcake.core.http_auth import MASTER_HTTP
            from kvcake.net.httpserve import client_auth

            auth = load_auth(env={"KVCAKE_AUTH_SECRET": self.secret})
            self._http_auth = client_auth(auth, MASTER_HTTP)
        return self._http_auth

    def scrape_evictions(self) -> None:
        """Record each live master's ``evicted_objects`` counter (an eviction fails a run)."""
        for m in self.masters:
            p = self.procs[m]
            if not p.alive() or p.paused:
                continue
            hits = list(LEADER.finditer(p.log.read_text(errors="replace")))
            if not hits:
                continue
            try:
                with self.hosts.inside(m):
                    r = httpx.get(f"http://{hits[-1]['http']}/metrics", timeout=2,
                                  auth=self.http_auth())  # fmt: skip
            except httpx.HTTPError:
                continue
            if r.status_code != 200:
                continue
            got = find(parse_metrics(r.text), "kvcake_store_evicted_objects")
            if got:
                self.scrapes += 1
                key = str(p.log)
                self.evicted[key] = max(self.evicted.get(key, 0), int(got[0][1]))
