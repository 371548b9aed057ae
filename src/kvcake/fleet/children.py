"""The processes of a ``kvcake up --config configs/vllm.toml`` cluster besides the engines: the
fleet proxy's command line and start. Every process of the fleet is a
:class:`kvcake.launch.child.Child` (a vLLM engine a :class:`kvcake.fleet.procs.VllmEngine`), so
:class:`kvcake.launch.supervisor.Supervisor` restarts any of them, on the ports pinned into its
argv, with the backoff it applies to kvcake's own clusters.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kvcake.fleet.procs import VllmEngine, VllmStartError
from kvcake.launch.child import Child

PROXY_READY = r"vllm-proxy url=(?P<url>\S+)\n"


def start_proxy(argv: list[str], log_path: Path, timeout_s: float = 120.0) -> Child:
    """Start the fleet proxy and wait for its first line (its URL: ``info["url"]``); its argv
    is pinned to the port it got (also when it asked for 0), for a restart."""
    proxy = Child("proxy", argv, log_path, error=VllmStartError).spawn()
    try:
        proxy.wait_line(PROXY_READY, timeout_s)
    except BaseException:
        proxy.stop(5)
        raise
    proxy.pin({"--port": proxy.info["url"].rsplit(":", 1)[1]})
    return proxy


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
