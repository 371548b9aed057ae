"""A whole kvcake cluster over emulated hosts (one network namespace each, real TCP between).

Hosts: ``master``, ``store-<i>``, ``prefill-<i>``, ``decode-<i>``, ``proxy`` and ``client``
(nothing runs there: tests and users send requests from it). Every server binds its host's
``10.199.0.x`` address; the Transfer Engine takes TCP between hosts (distinct hostnames, private
``/dev/shm``: :mod:`kvcake.launch.netns`). Options: ``rate`` caps every host's egress with
``tbf``; ``delay_ms`` puts a delaying relay (:mod:`kvcake.launch.netns_relay`) in front of the
master's RPC and of every instance's HTTP RPC, so store lookups and the proxy's instance calls
pay it (one way, each direction). The shared secret (``KVCAKE_AUTH_SECRET``) is set for every
process: they bind non-loopback addresses.

Script: ``kvcake netns-up [--config FILE] [--prefill N] [--decode M]
[--stores S] [--rate 1gbit] [--delay-ms 2]`` (root) prints the hosts and the endpoint and runs
until Ctrl-C; docs/deploy.md, "A multi-host cluster on one machine".
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from kvcake.core.errors import KvcakeError
from kvcake.launch.child import Child, stop_tiers
from kvcake.launch.clusterfile import load_serve_file, toml_dump
from kvcake.launch.ha_pool import LEADER, etcd_alive
from kvcake.launch.netns import Network
from kvcake.serve.config import ServeFile


class NetnsClusterError(KvcakeError):
    """A process of the namespace cluster failed to start (its log tail is in the message)."""


@dataclass(frozen=True)
class NetnsOptions:
    prefill: int = 1
    decode: int = 1
    stores: int = 2
    store_size: str = "64MB"
    rate: str = ""  # tc rate of every host's egress ("" = unlimited)
    delay_ms: float = 0.0  # one-way delay on master RPC and instance RPC (0 = no relay)
    client_ttl_s: float = 10.0  # the master expires silent clients / storage nodes after this
    # > 0: that many HA masters (hosts master-<i>) on an etcd (host "etcd", which also runs the
    # instances' Transfer Engine directory); everybody addresses the pool as etcd://
    ha_masters: int = 0
    config: str | None = None  # cluster file for [kv], [instance], [proxy] (emulated default)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    startup_timeout_s: float = 180.0


@dataclass
class Proc(Child):
    """One process on one emulated host ``role`` (supervised: :mod:`.supervisor`); ``argv`` is
    the command inside the namespace, ``wrap`` what runs it there (``Network.command``)."""

    role: str = ""
    wrap: list[str] = field(default_factory=list)

    def command(self) -> list[str]:
        return [*self.wrap, *self.argv]

    def describe(self) -> str:
        return f"{self.name} on {self.role}"


class NetnsCluster:
    """Use as a context manager: everything (processes, namespaces) is gone on exit."""

    def __init__(self, opts: NetnsOptions, run_dir: Path):
        self.opts = opts
        self.run_dir = run_dir
        self.conf: ServeFile = self._serve_file()
        masters = [f"master-{i}" for i in range(opts.ha_masters)]
        roles = [*(["etcd", *masters] if masters else ["master"]),
                 *(f"store-{i}" for i in range(opts.stores)),
                 *(f"prefill-{i}" for i in range(opts.prefill)),
                 *(f"decode-{i}" for i in range(opts.decode)), "proxy", "client"]  # fmt: skip
        self.net = Network(roles)
        self.secret = secrets.token_hex(16)
        self.procs: list[Proc] = []
        self.children = self.procs  # the supervisor's name for them (the same list)
        self.master = ""  # the master RPC address clients use (the relay's with delay_ms)
        self.directory = ""
        self.url = ""  # the proxy's base URL (reach it from the client host)
        self.instances: dict[str, str] = {}
        self.lock = threading.RLock()  # the supervisor's passes vs stop()
        self.stopping = False
        self.on_change: Callable[[], None] = lambda: None  # the state file's writer (netns_up)

    def _serve_file(self) -> ServeFile:
        ov: dict[str, dict[str, Any]] = {}
        if self.opts.config is None:  # no file: an emulated cluster (no weights needed)
            ov["instance"] = {"backend": "emulated"}
        for k, v in self.opts.overrides.items():
            ov.setdefault(k, {}).update(v)
        return load_serve_file(self.opts.config, ov)

    def __enter__(self) -> NetnsCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- start --------------------------------------------------------------------------------
    def start(self) -> str:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.net.create()
            if self.opts.rate:
                for role in self.net.hosts:
                    self.net.limit(role, self.opts.rate)
            if self.opts.ha_masters:
                self._start_ha_masters()
            else:
                self._start_master()
            self._start_stores()
            self._start_instances()
            self._start_proxy()
        except BaseException:
            self.stop()
            raise
        return self.url

    def _start_master(self) -> None:
        h = self.net["master"]
        m = self.spawn("master", "master", ["master", "--host", h.addr, "--port", "0",
                       "--http-port", "0", "--directory-port", "0",
                       "--client-ttl-s", str(self.opts.client_ttl_s)],
                       r"master rpc=(?P<rpc>\S+) directory=(?P<directory>\S+) http=(?P<http>\S+)")  # fmt: skip
        self.directory = m.info["directory"]
        flags = {"--port": "rpc", "--http-port": "http", "--directory-port": "directory"}
        m.pin({flag: m.info[key].rsplit(":", 1)[1] for flag, key in flags.items()})
        self.master = self.relayed("master", m.info["rpc"])

    def _start_ha_masters(self) -> None:
        """etcd and the directory on host ``etcd``, one HA master per ``master-<i>`` host."""

        e = self.net["etcd"].addr
        url, peer = f"http://{e}:2379", f"http://{e}:2380"
        argv = ["etcd", "--name", "kvc", "--data-dir", str(self.run_dir / "etcd"),
                "--listen-client-urls", url, "--advertise-client-urls", url,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"kvc={peer}", "--log-level", "warn"]  # fmt: skip
        etcd = self.spawn("etcd", "etcd", argv, None, raw=True)
        deadline = time.monotonic() + self.opts.startup_timeout_s

        def etcd_up() -> bool:
            with self.net.inside("etcd"):
                return etcd_alive(url)

        etcd.wait_until(etcd_up, self.opts.startup_timeout_s, lambda: "did not start", 0.1)
        argv = ["transfer-server", "--metadata", "--metadata-host", e]
        d = self.spawn("directory", "etcd", argv, r'"directory": "(?P<directory>[^"]+)"')
        self.directory = d.info["directory"]
        d.pin({"--metadata-port": self.directory.rsplit(":", 1)[1]})
        for i in range(self.opts.ha_masters):
            role = f"master-{i}"
            argv = ["master", "--host", self.net[role].addr, "--port", "0", "--http-port", "0",
                    "--directory-port", "0", "--etcd-endpoints", url,
                    "--client-ttl-s", str(self.opts.client_ttl_s)]  # fmt: skip
            self.spawn(role, role, argv, r"master standby")
        while not self.leader():
            if time.monotonic() > deadline:
                raise NetnsClusterError(self.proc("master-0").failure("no leader"))
            time.sleep(0.1)
        self.master = f"etcd://{e}:2379/kvcake"

    def leader(self) -> str:
        """The HA master whose log shows the highest leader term ("" before any)."""

        best, name = -1, ""
        for p in self.procs:
            if p.name.startswith("master-"):
                for m in LEADER.finditer(p.log_text()):
                    if int(m["term"]) > best:
                        best, name = int(m["term"]), p.name
        return name

    def relayed(self, role: str, target: str) -> str:
        """``target`` (on host ``role``) as peers should address it: through a delaying relay
        on that host when ``delay_ms`` is set."""
        if not self.opts.delay_ms:
            return target
        addr = self.net[role].addr
        name = f"relay-{role}-{len([p for p in self.procs if p.name.startswith('relay-')])}"
        argv = [sys.executable, "-m", "kvcake", "netns-relay", "--delay-ms",
                str(self.opts.delay_ms), "--route", f"{addr}:0={target}"]  # fmt: skip
        p = self.spawn(name, role, argv, r"relay on (?P<addr>\S+) ->", raw=True)
        p.pin({"--route": f"{p.info['addr']}={target}"})
        return p.info["addr"]

    def _start_stores(self) -> None:
        stores = []
        for i in range(self.opts.stores):
            role = f"store-{i}"
            argv = ["store-server", "--master", self.master, "--hostname", self.net[role].addr,
                    "--segment-size", self.opts.store_size, "--name", role]  # fmt: skip
            stores.append(self.spawn(role, role, argv, None))
        for s in stores:
            self.wait_line(s, r"store-server segment=(?P<segment>\S+)")

    def _start_instances(self) -> None:
        started = []
        for role in [f"prefill-{i}" for i in range(self.opts.prefill)] + [
            f"decode-{i}" for i in range(self.opts.decode)
        ]:
            inst = replace(self.conf.instance, id=role, host=self.net[role].addr, port=0,
                           directory=self.directory, master=self.master)  # fmt: skip
            cfg = self.run_dir / f"{role}.toml"
            cfg.write_text(toml_dump({"kv": self.conf.kv, "instance": inst}))
            kind = role.split("-")[0]
            started.append((self.spawn(role, role, [kind, "--config", str(cfg)], None), inst, cfg))
        for p, inst, cfg in started:
            self.wait_line(p, r"ready on (?P<url>http://\S+)")
            host, port = p.info["url"].removeprefix("http://").split("/")[0].rsplit(":", 1)
            self._pin_config(cfg, "instance", inst, int(port))
            self.instances[p.name] = "http://" + self.relayed(p.role, f"{host}:{port}")

    def _start_proxy(self) -> None:
        urls = self.instances
        proxy = replace(self.conf.proxy, host=self.net["proxy"].addr, port=0,
                        prefill=tuple(u for n, u in urls.items() if n.startswith("prefill")),
                        decode=tuple(u for n, u in urls.items() if n.startswith("decode")),
                        master=self.master, directory=self.directory)  # fmt: skip
        cfg = self.run_dir / "proxy.toml"
        cfg.write_text(toml_dump({"kv": self.conf.kv, "proxy": proxy}))
        argv = ["proxy", "--config", str(cfg), "--backend", self.conf.instance.backend]
        p = self.spawn("proxy", "proxy", argv, r"proxy on (?P<url>http://\S+)/v1")
        self.url = p.info["url"]
        self._pin_config(cfg, "proxy", proxy, int(self.url.rsplit(":", 1)[1]))

        def healthy() -> bool:  # asked from the client host
            with contextlib.suppress(httpx.HTTPError):
                return self.http("GET", "/health", timeout=2).status_code == 200
            return False

        p.wait_until(healthy, self.opts.startup_timeout_s, lambda: "never became healthy", 0.2)

    # --- processes ----------------------------------------------------------------------------
    def child_env(self, role: str = "") -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1", KVCAKE_AUTH_SECRET=self.secret,
                   **self.net.env())  # fmt: skip
        if role and self.opts.delay_ms:
            # Peers reach this host's HTTP through a relay on another port: signed requests
            # name the relay's address, which the server accepts as its own ([auth] http_names).
            env["KVCAKE_AUTH_HTTP_NAMES"] = self.net[role].addr
        return env

    def spawn(
        self, name: str, role: str, args: list[str], ready: str | None, raw: bool = False
    ) -> Proc:
        """Start ``kvcake <args>`` (``raw``: ``args`` as is) on host ``role``; with ``ready``,
        wait for that line."""
        argv = args if raw else [sys.executable, "-m", "kvcake", *args]
        p = Proc(name, argv, self.run_dir / f"{name}.log", env=self.child_env(role),
                 error=NetnsClusterError, role=role, wrap=self.net.command(role, []))  # fmt: skip
        self.procs.append(p.spawn())
        if ready:
            self.wait_line(p, ready)
        return p

    def _pin_config(self, path: Path, section: str, cfg: Any, port: int) -> None:
        """Rewrite a config file with the port its process got (asked for 0): a restart
        comes back where the proxy (or the client) already points."""
        path.write_text(toml_dump({"kv": self.conf.kv, section: replace(cfg, port=port)}))

    # --- supervision (launch/supervisor.py's Supervised) ----------------------------------------
    def respawn(self, ch: Proc) -> None:
        """Start ``ch`` again on its host, same command and ports, its log appended to."""
        ch.spawn(append=True)

    def write_state(self) -> None:
        self.on_change()

    def say(self, msg: str) -> None:
        print(msg, flush=True)

    def wait_line(self, p: Proc, pattern: str) -> None:
        p.wait_line(pattern, self.opts.startup_timeout_s)

    def proc(self, name: str) -> Proc:
        return next(p for p in self.procs if p.name == name)

    def http(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One HTTP call to the proxy from the client host."""
        kw.setdefault("timeout", 60)
        with self.net.inside("client"):
            return httpx.request(method, self.url + path, **kw)

    def run_python(
        self, role: str, code: str, args: list[str], stdin: str = "", timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python -c code args...`` on host ``role`` (with the cluster's secret)."""
        cmd = self.net.command(role, [sys.executable, "-c", code, *args])
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True,
                              timeout=timeout, env=self.child_env())  # fmt: skip

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM everything but etcd and the directory, then those (masters resign while
        etcd still answers); SIGKILL after the grace; then delete the namespaces (which kills
        whatever is left in them)."""
        with self.lock:
            self.stopping = True  # no restart from here on
        last = [p for p in self.procs if p.name in ("etcd", "directory")]
        stop_tiers(([p for p in reversed(self.procs) if p not in last], last), grace_s)
        self.procs.clear()
        self.net.close()
