"""``kvcake up``: start a whole local cluster from one config file and supervise it.

Order: master (hosts the Transfer Engine directory; without a store, a bare
``kvcake transfer-server --metadata`` does), store-servers, prefill/decode (or colocated)
instances, proxy. Every child is a real process whose output goes to ``<run_dir>/<name>.log``;
the launcher learns bound addresses from each child's one "ready" line, waits for the proxy's
``/health`` and writes ``<run_dir>/cluster.json`` (pids and their start times, every port,
restarts) for ``kvcake status``/``down``. A child that exits during startup stops everything and
its log tail is shown. Once up, every port a child bound is written back into its argv / config
file, so a restart (``Cluster(supervise=True)``: :mod:`kvcake.launch.supervisor`, or by hand with
``kvcake decode --config <run_dir>/decode-0.toml``) comes back at the same address. Stopping
sends SIGTERM to the children in reverse order (then SIGKILL after a grace period).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvcake.core.config import load_config
from kvcake.launch.child import Child, stop_tiers
from kvcake.launch.clusterfile import (  # noqa: F401  (re-exported: callers import them here)
    check_model,
    check_port_free,
    load_serve_file,
    toml_dump,
)
from kvcake.launch.ha_pool import start_ha_pool
from kvcake.launch.runstate import write_state
from kvcake.launch.supervisor import Supervisor
from kvcake.serve.config import InstanceConfig, ServeFile, load_proxy_config

STATE_FILE = "cluster.json"


class Cluster:
    """A supervised local cluster. Use as a context manager (stops everything on exit)."""

    def __init__(
        self, conf: ServeFile, run_dir: Path | None = None, quiet: bool = False,
        supervise: bool = False,
    ):  # fmt: skip
        self.conf = conf
        self.lock = threading.RLock()
        self.stopping = False
        self.supervisor: Supervisor | None = Supervisor(self) if supervise else None
        stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        self.run_dir = run_dir or Path(conf.cluster.run_dir) / stamp
        self.children: list[Child] = []
        self.url = ""
        self.quiet = quiet
        self.instance_urls: dict[str, str] = {}

    # --- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        if not self.children:  # `cluster.start()` then `with cluster:` starts it once
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def say(self, msg: str) -> None:
        if not self.quiet:
            print(msg, flush=True)

    def start(self) -> str:
        c, inst = self.conf.cluster, self.conf.instance
        check_model(inst.backend)
        check_port_free(c.host, c.proxy_port, "cluster.proxy_port")
        for key in ("master_port", "master_http_port", "directory_port"):
            check_port_free(c.host, getattr(c, key), f"cluster.{key}")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_all()
        except BaseException:
            self.stop()
            raise
        self._pin_ports()
        self.write_state()
        if self.supervisor is not None:
            self.supervisor.start()
        return self.url

    def _pin_ports(self) -> None:
        """Write every bound port back into the children's argv / config files, so a
        restarted child listens where its peers already look for it."""
        for ch in self.children:
            if ch.name == "master":
                rpc, dir_, http = (
                    ch.info[k].rsplit(":", 1)[1] for k in ("rpc", "directory", "http")
                )
                ch.pin({"--port": rpc, "--directory-port": dir_, "--http-port": http})
            elif ch.name == "directory":
                ch.pin({"--metadata-port": ch.info["directory"].rsplit(":", 1)[1]})
            elif "url" in ch.info:
                self._pin_config_port(ch, int(ch.info["url"].rsplit(":", 1)[1].split("/")[0]))

    def _pin_config_port(self, ch: Child, port: int) -> None:
        cfg = Path(ch.argv[ch.argv.index("--config") + 1])
        sec = "proxy" if ch.name == "proxy" else "instance"
        cur: Any = (load_proxy_config(cfg) if ch.name == "proxy"
                    else load_config(InstanceConfig, toml_path=cfg, section=sec))  # fmt: skip
        cfg.write_text(toml_dump({"kv": self.conf.kv, sec: replace(cur, port=port)}))

    def _start_all(self) -> None:
        c = self.conf.cluster
        directory, master = self._start_pool()
        self.master_rpc = master  # the proxy follows the pool through its KV events
        self.directory = directory  # ... and checks that this lists every KV segment
        roles = ["colocated"] * c.prefill if c.colocated else ["prefill"] * c.prefill
        roles += [] if c.colocated else ["decode"] * c.decode
        counts: dict[str, int] = {}
        started = []
        for role in roles:
            i = counts[role] = counts.get(role, -1) + 1
            port = 0
            if c.instance_base_port:
                port = c.instance_base_port + i + (50 if role == "decode" else 0)
                check_port_free(c.host, port, "cluster.instance_base_port")
            inst = self._instance_config(f"{role}-{i}", port, directory, master)
            started.append(self._spawn_instance(role, inst))
        for ch in started:  # model loads overlap: wait for all after starting all
            self._wait_line(ch, r"ready on (?P<url>http://\S+)")
            self.instance_urls[ch.name] = ch.info["url"]
            self.say(f"  {ch.name:<12} {ch.info['url']}")
        self._start_proxy()

    def _instance_config(self, iid: str, port: int, directory: str, master: str) -> InstanceConfig:
        return replace(
            self.conf.instance, id=iid, host=self.conf.cluster.host, port=port,
            directory=directory, master=master,
        )  # fmt: skip

    def _spawn_instance(self, role: str, inst: InstanceConfig) -> Child:
        cfg = self.run_dir / f"{inst.id}.toml"
        cfg.write_text(toml_dump({"kv": self.conf.kv, "instance": inst}))
        return self._spawn(inst.id, [role, "--config", str(cfg)])

    def _start_pool(self) -> tuple[str, str]:
        c = self.conf.cluster
        if self.conf.ha.enabled:  # etcd + several masters; everybody on etcd://
            return start_ha_pool(self)
        if c.store_servers == 0:
            ch = self._spawn("directory", ["transfer-server", "--metadata", "--metadata-host",
                                           c.host, "--metadata-port",
                                           str(c.directory_port or c.master_port)])  # fmt: skip
            self._wait_line(ch, r'"directory": "(?P<directory>[^"]+)"')
            return ch.info["directory"], ""
        ch = self._spawn("master", ["master", "--host", c.host, "--port", str(c.master_port),
                                    "--http-port", str(c.master_http_port),
                                    "--directory-port", str(c.directory_port)]
                        + (["--state-dir", str(self.run_dir / "master-state")]
                           if c.master_state else []))  # fmt: skip
        self._wait_line(
            ch, r"master rpc=(?P<rpc>\S+) directory=(?P<directory>\S+) http=(?P<http>\S+)"
        )
        self.say(f"  master       rpc {ch.info['rpc']}, directory {ch.info['directory']}")
        stores = [
            self._spawn(
                f"store-{i}",
                [
                    "store-server",
                    "--master",
                    ch.info["rpc"],
                    "--segment-size",
                    str(c.store_size),
                    "--name",
                    f"store-{i}",
                ],
            )
            for i in range(c.store_servers)
        ]
        for s in stores:
            self._wait_line(s, r"store-server segment=(?P<segment>\S+)(?: disk=(?P<disk>\S+))?")
        return ch.info["directory"], ch.info["rpc"]

    def _start_proxy(self) -> None:
        c, p = self.conf.cluster, self.conf.proxy
        urls = list(self.instance_urls.items())
        pre = tuple(u for n, u in urls if not n.startswith("decode"))
        dec = tuple(u for n, u in urls if n.startswith("decode"))
        proxy = replace(p, host=c.host, port=c.proxy_port, prefill=pre, decode=dec,
                        master=getattr(self, "master_rpc", ""),
                        directory=p.directory or getattr(self, "directory", ""))  # fmt: skip
        # Every run logs its requests (`kvcake logs` reads the latest run's).
        log = p.request_log or str((self.run_dir / "requests.jsonl").resolve())
        proxy = replace(proxy, request_log=log)
        cfg = self.run_dir / "proxy.toml"
        cfg.write_text(toml_dump({"kv": self.conf.kv, "proxy": proxy}))
        argv = ["proxy", "--config", str(cfg), "--backend", self.conf.instance.backend]
        ch = self._spawn("proxy", argv + (["--colocated"] if c.colocated else []))
        self._wait_line(ch, r"proxy on (?P<url>http://\S+)/v1")
        self.url = ch.info["url"]
        ch.wait_http(self.url + "/health", self.conf.cluster.startup_timeout_s)

    # --- processes (kvcake.launch.child) ------------------------------------------------------
    def _spawn(self, name: str, args: list[str], raw: bool = False) -> Child:
        """Start ``kvcake <args>`` (``raw``: ``args`` as they are) logging to its own file."""
        argv = args if raw else [sys.executable, "-m", "kvcake", *args]
        ch = Child(name, argv, self.run_dir / f"{name}.log").spawn()
        with self.lock:
            self.children.append(ch)
        return ch

    def respawn(self, ch: Child) -> None:
        """Start an exited child again (same argv, ports pinned by ``_pin_ports``)."""
        with self.lock:
            if not self.stopping:
                ch.spawn(append=True)

    def _wait_line(self, ch: Child, pattern: str) -> None:
        ch.wait_line(pattern, self.conf.cluster.startup_timeout_s)

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM tier by tier (proxy, instances, storage, master/directory), so nobody
        loses a peer it still needs while shutting down; SIGKILL after ``grace_s``."""
        with self.lock:
            self.stopping = True
        if self.supervisor is not None:
            self.supervisor.stop()
        tiers: list[list[Child]] = [[], [], [], [], []]
        for ch in self.children:
            tier = {"proxy": 0, "store": 2, "master": 3, "directory": 3, "etcd": 4}
            tiers[tier.get(ch.name.split("-")[0], 1)].append(ch)
        stop_tiers(tiers, grace_s)
        self.children.clear()
        state = self.run_dir / STATE_FILE
        if state.exists():
            state.unlink()

    def write_state(self) -> None:
        with self.lock:
            if self.stopping:
                return
            procs = {
                c.name: {"pid": c.proc.pid, "start_ticks": c.start_ticks, "restarts": c.restarts,
                         "last_exit": c.last_exit, "alive": c.proc.poll() is None,
                         "addresses": dict(c.info)}
                for c in self.children if c.proc is not None
            }  # fmt: skip
        write_state(
            [self.run_dir / STATE_FILE, Path(self.conf.cluster.run_dir) / "latest.json"],
            self.url, self.run_dir, procs, instances=self.instance_urls,
            master=getattr(self, "master_rpc", ""),  # etcd://... with [ha]: status asks it
        )  # fmt: skip

    def dead_children(self) -> list[str]:
        return [c.name for c in self.children if c.proc is not None and c.proc.poll() is not None]
