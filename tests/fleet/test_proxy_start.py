"""The fleet proxy's process (``kvcake vllm-proxy``) as ``kvcake up`` starts it: through
``fleet.children.start_proxy`` (a :class:`kvcake.launch.child.Child`), served by
``kvcake.net.httpserve.serve``; no vLLM engine needed (the one named is down)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx

from kvcake.fleet.children import start_proxy


def _argv(port: int) -> list[str]:
    return [sys.executable, "-m", "kvcake", "vllm-proxy", "--port", str(port),
            "--engine", "e0=http://127.0.0.1:9"]  # fmt: skip


def test_the_proxy_starts_answers_and_stops(tmp_path: Path) -> None:
    proxy = start_proxy(_argv(0), tmp_path / "proxy.log")
    try:
        url = proxy.info["url"]
        port = url.rsplit(":", 1)[1]
        assert proxy.argv[proxy.argv.index("--port") + 1] == port  # pinned for a restart
        r = httpx.get(url + "/health", timeout=10)
        assert r.status_code == 503  # its only engine does not answer
        assert httpx.get(url + "/fleet", timeout=10).json()["engines"]["e0"]["healthy"] is False
    finally:
        proxy.stop()
    assert proxy.proc is not None and proxy.proc.returncode is not None


def test_a_busy_port_is_a_config_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        p = subprocess.run(_argv(port), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "vllm-proxy (--port): cannot listen on" in p.stderr
