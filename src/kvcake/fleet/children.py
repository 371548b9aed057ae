"""The processes of a ``kvcake up --config configs/vllm.toml`` cluster as supervised children.

Each :class:`VllmChild` knows how to start its process again on the same ports (the master on
its RPC port, so every client's address stays valid; a vLLM engine with the same spec; the
proxy on its port), so :class:`kvcake.launch.supervisor.Supervisor` can restart any of them with
the backoff it applies to kvcake's own clusters. ``start`` blocks until the new process is
ready (a vLLM engine: its ``/health``), which may take a minute: the supervisor's pass waits.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcake.fleet.procs import (
    KvcakeProc,
    VllmEngine,
    VllmEngineSpec,
    VllmStartError,
    spawn_kvcake,
    start_engine,
)
from kvcake.launch.supervisor import RestartState, die_with_parent


@dataclass
class VllmChild(RestartState):
    """One supervised process. ``holder`` is what ``stop`` is called on (``VllmEngine``,
    ``KvcakeProc`` or the proxy's ``Popen``); ``start`` makes a new one on the same ports."""

    name: str
    holder: Any
    start: Callable[[], Any]
    log: str

    @property
    def proc(self) -> subprocess.Popen[Any]:
        return self.holder if isinstance(self.holder, subprocess.Popen) else self.holder.proc

    def respawn(self) -> None:
        self.holder = self.start()
        self.started = time.monotonic()


def _port(address: str) -> str:
    return address.rsplit(":", 1)[1]


def master_child(holder: KvcakeProc, log: str) -> VllmChild:
    port = _port(holder.info["rpc"])
    return VllmChild(
        "master", holder, lambda: spawn_kvcake("master", "--port", port, "--http-port", "0"), log
    )


def store_child(holder: KvcakeProc, master: str, size: str, log: str) -> VllmChild:
    def start() -> KvcakeProc:
        return spawn_kvcake("store-server", "--master", master, "--segment-size", size)

    return VllmChild("store-0", holder, start, log)


def engine_child(engine: VllmEngine, run_dir: Path, timeout_s: float) -> VllmChild:
    spec: VllmEngineSpec = engine.spec

    def start() -> VllmEngine:
        e = start_engine(spec, run_dir)
        e.wait_ready(timeout_s)
        return e

    return VllmChild(spec.name, engine, start, str(engine.log_path))


def start_proxy(argv: list[str], log_path: Path) -> tuple[subprocess.Popen[str], str]:
    """Start the fleet proxy; returns it and its URL (its first stdout line says it)."""
    with log_path.open("a") as log:
        proxy = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    assert proxy.stdout is not None
    line = proxy.stdout.readline()
    if not line.startswith("vllm-proxy url="):
        proxy.kill()
        raise VllmStartError(f"the proxy did not start: {line!r} (log {log_path})")
    return proxy, line.split("=", 1)[1].strip()


def proxy_child(proxy: subprocess.Popen[str], url: str, argv: list[str], log: Path) -> VllmChild:
    fixed = list(argv)
    i = fixed.index("--port")
    fixed[i + 1] = _port(url)  # the port it got, also when the config said 0

    def start() -> subprocess.Popen[str]:
        return start_proxy(fixed, log)[0]

    return VllmChild("proxy", proxy, start, str(log))


PROXY_FLAGS = {"kv_both": "--engine", "kv_producer": "--prefill", "kv_consumer": "--decode"}


def proxy_argv(
    master: str, port: int, block_size: int, engines: list[VllmEngine],
    roles: dict[str, str] | None = None,
) -> list[str]:  # fmt: skip
    """The fleet proxy's command line. An engine's part follows its connector ``kv_role``
    (kv_both ``--engine``, kv_producer ``--prefill``, kv_consumer ``--decode``) unless
    ``roles`` maps its name to ``both`` / ``prefill`` / ``decode`` (a kv_both engine can
    take either P/D part)."""
    argv = [sys.executable, "-m", "kvcake", "vllm-proxy", "--master", master,
            "--port", str(port), "--block-tokens", str(block_size)]  # fmt: skip
    by_role = {"both": "--engine", "prefill": "--prefill", "decode": "--decode"}
    for e in engines:
        name = e.spec.name
        flag = by_role[roles[name]] if roles and name in roles else PROXY_FLAGS[e.spec.kv_role]
        argv += [flag, f"{name}={e.url}@tcp://127.0.0.1:{e.spec.kv_events_port}"]
    return argv
