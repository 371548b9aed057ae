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
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import httpx

from kvcake.core.config import parse_size, require
from kvcake.core.errors import ConfigError
from kvcake.core.ports import free_port
from kvcake.fleet.children import (
    VllmChild,
    engine_child,
    master_child,
    proxy_argv,
    proxy_child,
    start_proxy,
    store_child,
)
from kvcake.fleet.procs import (
    VllmEngine,
    VllmEngineSpec,
    VllmStartError,
    default_model_dir,
    spawn_kvcake,
    start_engine,
)
from kvcake.launch.runstate import proc_start_ticks
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
    try:
        return "vllm" in tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return False


def load(path: str | Path) -> VllmClusterConfig:
    raw = dict(tomllib.loads(Path(path).read_text()).get("vllm", {}))
    known = {f.name for f in fields(VllmClusterConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown [vllm] key(s) {unknown}; known: {sorted(known)}")
    if "cpus" in raw:
        raw["cpus"] = tuple(str(c) for c in raw["cpus"])
    if ("prefill" in raw or "decode" in raw) and "engines" not in raw:
        raw["engines"] = 0  # a P/D file: no kv_both engines unless it asks
    try:
        return VllmClusterConfig(**raw)
    except TypeError as exc:  # e.g. a string where a number belongs
        raise ConfigError(f"{path}: [vllm]: {exc}") from None


class VllmCluster:
    """The running cluster; also what :class:`Supervisor` needs (``children``, ``lock``,
    ``stopping``, ``respawn``, ``write_state``, ``say``): a child that dies is started again on
    its ports. Invariant: ``children`` holds every process started, in start order."""

    def __init__(self, cfg: VllmClusterConfig):
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir) / (time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
        self.children: list[VllmChild] = []
        self.addresses: dict[str, dict[str, str]] = {}
        self.lock = threading.RLock()
        self.stopping = False
        self.url = ""

    def say(self, msg: str) -> None:
        print(msg, flush=True)

    def respawn(self, ch: VllmChild) -> None:
        if isinstance(ch.holder, VllmEngine):
            gone = ch.holder.reclaim_shm()  # a SIGKILLed engine never unlinks its queues
            if gone:
                self.say(f"{ch.name}: removed {len(gone)} shared-memory segment(s) it left")
        ch.respawn()

    def start(self) -> str:
        c = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        m = spawn_kvcake("master", "--port", str(c.master_port), "--http-port", "0")
        self.children.append(master_child(m, "kvcake up output"))
        self.addresses["master"] = m.info
        rpc = m.info["rpc"]
        s = spawn_kvcake("store-server", "--master", rpc, "--segment-size", c.store_size)
        self.children.append(store_child(s, rpc, c.store_size, "kvcake up output"))
        self.addresses["store-0"] = s.info
        model = c.model or default_model_dir()
        engines: list[VllmEngine] = []
        for i, (name, role) in enumerate(c.roles()):
            spec = VllmEngineSpec(
                name, free_port(), model, c.served_model_name, rpc, kv_role=KV_ROLES[role],
                connector_extra=dict(c.connector), block_size=c.block_size,
                max_model_len=c.max_model_len, kv_cache_gib=c.kv_cache_gib,
                cpu=c.cpus[i % len(c.cpus)], kv_events_port=free_port(),
            )  # fmt: skip
            engines.append(start_engine(spec, self.run_dir))
        for e in engines:
            e.wait_ready(c.startup_timeout_s)
            self.children.append(engine_child(e, self.run_dir, c.startup_timeout_s))
            self.addresses[e.spec.name] = {"url": e.url, "events": str(e.spec.kv_events_port)}
        argv = proxy_argv(rpc, c.proxy_port, c.block_size, engines)
        log = self.run_dir / "proxy.log"
        proxy, self.url = start_proxy(argv, log)
        self.children.append(proxy_child(proxy, self.url, argv, log))
        self.addresses["proxy"] = {"url": self.url}
        deadline = time.monotonic() + 60
        while httpx.get(self.url + "/health", timeout=5).status_code != 200:
            if time.monotonic() > deadline:
                raise VllmStartError("the proxy sees no healthy engine")
            time.sleep(0.5)
        self.write_state()
        return self.url

    def write_state(self) -> None:
        procs = {}
        for ch in self.children:
            pid = int(ch.proc.pid)
            procs[ch.name] = {"pid": pid, "start_ticks": proc_start_ticks(pid),
                              "restarts": ch.restarts, "last_exit": ch.last_exit,
                              "alive": ch.proc.poll() is None, "log": ch.log,
                              "addresses": self.addresses.get(ch.name, {})}  # fmt: skip
        doc = {"supervisor_pid": os.getpid(), "supervisor_start_ticks": proc_start_ticks(os.getpid()),
               "url": self.url, "run_dir": str(self.run_dir), "processes": procs,
               "instances": {n: a["url"] for n, a in self.addresses.items() if n.startswith("vllm-")}}  # fmt: skip
        text = json.dumps(doc, indent=2)
        for path in (self.run_dir / "cluster.json", Path(self.cfg.run_dir) / "latest.json"):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
        for ch in reversed(self.children):
            h = ch.holder
            if isinstance(h, subprocess.Popen):
                h.terminate()
                try:
                    h.wait(10)
                except subprocess.TimeoutExpired:
                    h.kill()
            else:
                h.stop()
        self.children.clear()
        (Path(self.cfg.run_dir) / "latest.json").unlink(missing_ok=True)


def up(path: str, detach: bool = False) -> int:
    """Foreground: start, wait for SIGINT/SIGTERM (``kvcake down``), stop everything."""
    from kvcake.launch.runstate import live_cluster

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
