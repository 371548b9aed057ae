"""``kvcake up --config configs/vllm.toml``: master, store-server, N vLLM engines with the
KvcakeConnector, and the vLLM fleet proxy, recorded in ``<run_dir>/latest.json`` in the same
form as :mod:`kvcake.launch.launcher` so ``kvcake status`` / ``kvcake down`` manage it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcake.core.config import load_config, parse_size, read_toml, require
from kvcake.core.errors import ConfigError
from kvcake.core.ports import free_port
from kvcake.fleet.children import PROXY_READY, proxy_argv, start_proxy
from kvcake.fleet.procs import (
    VllmEngine,
    VllmEngineSpec,
    default_model_dir,
    spawn_kvcake,
    start_engine,
    wait_kv_line,
)
from kvcake.launch.child import Child, stop_tiers
from kvcake.launch.runstate import live_cluster, write_state
from kvcake.launch.supervisor import Supervisor

KV_ROLES = {"both": "kv_both", "prefill": "kv_producer", "decode": "kv_consumer"}


@dataclass(frozen=True)
class VllmClusterConfig:
    """``[vllm]``. ``engines`` kv_both engines (each prefills and decodes its requests) plus
    ``prefill`` kv_producer and ``decode`` kv_consumer engines (P/D: the proxy prefills on one,
    decodes on another). A file that names ``prefill`` or ``decode`` and not ``engines`` has no
    kv_both engine."""

    engines: int = 2
    prefill: int = 0
    decode: int = 0
    model: str = ""
    served_model_name: str = "smollm2"
    block_size: int = 32
    max_model_len: int = 4096
    kv_cache_gib: int = 1
    cpus: tuple[str, ...] = ("0", "1")
    proxy_port: int = 8000
    master_port: int = 0
    store_size: str = "1GiB"
    run_dir: str = "runs"
    startup_timeout_s: float = 600.0
    connector: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        require(min(self.engines, self.prefill, self.decode) >= 0,
                "vllm.engines, vllm.prefill and vllm.decode must be >= 0")  # fmt: skip
        require(self.engines + self.prefill + self.decode >= 1, "the fleet needs an engine")
        require(self.prefill == 0 or self.decode + self.engines >= 1,
                "vllm.prefill engines need a decode (or kv_both) engine: set vllm.decode")  # fmt: skip
        require(self.decode == 0 or self.prefill + self.engines >= 1,
                "vllm.decode engines need a prefill (or kv_both) engine: set vllm.prefill")  # fmt: skip
        require(self.block_size >= 1, "vllm.block_size must be >= 1")
        require(self.kv_cache_gib >= 1, "vllm.kv_cache_gib must be an integer >= 1")
        require(bool(self.cpus), "vllm.cpus must name at least one core")
        parse_size(self.store_size)

    def roles(self) -> list[tuple[str, str]]:
        """(engine name, role) of every engine, in start order: ``vllm-<i>`` kv_both,
        ``vllm-prefill-<i>``, ``vllm-decode-<i>``."""
        out = [(f"vllm-{i}", "both") for i in range(self.engines)]
        out += [(f"vllm-prefill-{i}", "prefill") for i in range(self.prefill)]
        return out + [(f"vllm-decode-{i}", "decode") for i in range(self.decode)]


def is_vllm_config(path: str | Path) -> bool:
    """A cluster file for the vLLM fleet (it has a ``[vllm]`` section); False if unreadable."""
    try:
        return "vllm" in read_toml(path)
    except ConfigError:
        return False


def load(path: str | Path) -> VllmClusterConfig:
    """``[vllm]`` of ``path`` (:func:`kvcake.core.config.load_config`: KVCAKE_VLLM_* variables
    apply too)."""
    raw = read_toml(path).get("vllm", {})
    pd_only = isinstance(raw, dict) and ("prefill" in raw or "decode" in raw)
    over = {"engines": 0} if pd_only and "engines" not in raw else None  # a P/D file
    try:
        return load_config(VllmClusterConfig, toml_path=path, section="vllm", overrides=over)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


class VllmCluster:
    """The running cluster; also what :class:`Supervisor` needs (``children``, ``lock``,
    ``stopping``, ``respawn``, ``write_state``, ``say``): a child that dies is started again on
    its ports. Invariant: ``children`` holds every process started, in start order."""

    def __init__(self, cfg: VllmClusterConfig):
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir) / (time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
        self.children: list[Child] = []
        self.lock = threading.RLock()
        self.stopping = False
        self.url = ""

    def say(self, msg: str) -> None:
        print(msg, flush=True)

    def respawn(self, ch: Child) -> None:
        """Start ``ch`` again (same argv and ports) and wait until it is ready, as at start."""
        if isinstance(ch, VllmEngine):
            gone = ch.reclaim_shm()  # a SIGKILLed engine never unlinks its queues
            if gone:
                self.say(f"{ch.name}: removed {len(gone)} shared-memory segment(s) it left")
        ch.spawn(append=True)
        if isinstance(ch, VllmEngine):
            ch.wait_ready(self.cfg.startup_timeout_s)
        elif ch.name == "proxy":
            ch.wait_line(PROXY_READY, 120)
        else:
            wait_kv_line(ch, ch.argv[3], 60)  # python -m kvcake <command>

    def start(self) -> str:
        c = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        m = spawn_kvcake("master", "--port", str(c.master_port), "--http-port", "0",
                         log_dir=self.run_dir)  # fmt: skip
        self.children.append(m)
        m.pin({"--port": m.info["rpc"].rsplit(":", 1)[1]})  # every client's address stays valid
        rpc = m.info["rpc"]
        self.children.append(spawn_kvcake("store-server", "--master", rpc, "--segment-size",
                                          c.store_size, name="store-0", log_dir=self.run_dir))  # fmt: skip
        model = c.model or default_model_dir()
        engines: list[VllmEngine] = []
        for i, (name, role) in enumerate(c.roles()):
            spec = VllmEngineSpec(
                name, free_port(), model, c.served_model_name, rpc, kv_role=KV_ROLES[role],
                connector_extra=dict(c.connector), block_size=c.block_size,
                max_model_len=c.max_model_len, kv_cache_gib=c.kv_cache_gib,
                cpu=c.cpus[i % len(c.cpus)], kv_events_port=free_port(),
            )  # fmt: skip
            e = start_engine(spec, self.run_dir)
            e.info.update(url=e.url, events=str(spec.kv_events_port))
            engines.append(e)
            self.children.append(e)
        for e in engines:
            e.wait_ready(c.startup_timeout_s)
        argv = proxy_argv(rpc, c.proxy_port, c.block_size, engines)
        proxy = start_proxy(argv, self.run_dir / "proxy.log")
        self.children.append(proxy)
        self.url = proxy.info["url"]
        proxy.wait_http(self.url + "/health", 60, interval_s=0.5)  # the proxy sees an engine
        self.write_state()
        return self.url

    def write_state(self) -> None:
        procs = {
            ch.name: {"pid": ch.proc.pid, "start_ticks": ch.start_ticks, "restarts": ch.restarts,
                      "last_exit": ch.last_exit, "alive": ch.proc.poll() is None,
                      "log": str(ch.log), "addresses": dict(ch.info)}
            for ch in self.children if ch.proc is not None
        }  # fmt: skip
        instances = {ch.name: ch.info["url"] for ch in self.children if isinstance(ch, VllmEngine)}
        paths = [self.run_dir / "cluster.json", Path(self.cfg.run_dir) / "latest.json"]
        write_state(paths, self.url, self.run_dir, procs, instances=instances)

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
        stop_tiers(([ch] for ch in reversed(self.children)), 20.0)
        self.children.clear()
        (Path(self.cfg.run_dir) / "latest.json").unlink(missing_ok=True)


def up(path: str, detach: bool = False) -> int:
    """Foreground: start, wait for SIGINT/SIGTERM (``kvcake down``), stop everything."""

    cfg = load(path)
    if live_cluster(cfg.run_dir) is not None:
        print(f"kvcake: error: a cluster is already running from {cfg.run_dir}; stop it with "
              f"`kvcake down --run-dir {cfg.run_dir}`", file=sys.stderr)  # fmt: skip
        return 2
    if detach:
        run = Path(cfg.run_dir)
        run.mkdir(parents=True, exist_ok=True)
        (run / "latest.json").unlink(missing_ok=True)
        argv = [sys.executable, "-m", "kvcake", "up", "--config", path]
        with (run / "supervisor.log").open("wb") as fh:
            proc = subprocess.Popen(
                argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + cfg.startup_timeout_s + 60
        while (
            time.monotonic() < deadline
            and proc.poll() is None
            and not (run / "latest.json").exists()
        ):
            time.sleep(0.5)
        if not (run / "latest.json").exists():
            if proc.poll() is None:  # still starting past the deadline: stop it and its children
                proc.terminate()
                proc.wait(60)
            print((run / "supervisor.log").read_text()[-3000:], file=sys.stderr)
            return 2
        print(
            f"cluster up: {json.loads((run / 'latest.json').read_text())['url']}/v1 (stop: kvcake down)"
        )
        return 0
    cluster = VllmCluster(cfg)
    stop = {"now": False}

    def on_signal(*_: object) -> None:
        stop["now"] = True
        if not cluster.url:  # still starting (an engine start takes a minute): stop now
            raise SystemExit(143)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    kinds = f"{cfg.engines} kv_both, {cfg.prefill} prefill, {cfg.decode} decode"
    print(f"starting vLLM cluster ({kinds} engines), logs in {cluster.run_dir}", flush=True)
    supervisor = Supervisor(cluster)
    try:
        url = cluster.start()
        supervisor.start()  # a crashed engine, store, master or proxy is started again
        print(f"ready: OpenAI endpoint {url}/v1  (Ctrl-C stops the cluster)", flush=True)
        while not stop["now"]:
            time.sleep(0.2)
    finally:
        print("stopping cluster...", flush=True)
        supervisor.stop()
        cluster.stop()
    return 0
