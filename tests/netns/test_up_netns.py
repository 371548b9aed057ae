"""`kvcake up --netns --detach`: the cluster over emulated hosts runs in the background like any
other `kvcake up`; `status` names the client namespace the endpoint is reachable from; `down`
returns once every process and namespace is gone."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.netns.test_multihost import _netns_list
from tests.waits import wait_until


def kvcake(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvcake", *args], capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def alive(pid: int) -> bool:
    """Running, not a zombie (the detached supervisor's parent exited, and this sandbox's pid 1
    need not reap orphans)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.timeout(400)
def test_up_netns_detach_status_down(tmp_path: Path) -> None:
    text = (Path(__file__).parents[2] / "configs" / "emulated.toml").read_text()
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(text.replace('run_dir = "runs"', f'run_dir = "{tmp_path / "runs"}"'))
    before = set(_netns_list())
    up = kvcake("up", "--netns", "--detach", "--config", str(cfg))
    st: dict = {}  # type: ignore[type-arg]
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        st = json.loads((tmp_path / "runs" / "latest.json").read_text())
        ns, url = st["netns_client"], st["url"]
        assert ns in _netns_list()
        probe = "import httpx,sys; print(httpx.get(sys.argv[1] + '/v1/models', timeout=30).json())"
        models = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", probe, url],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert models.returncode == 0 and "data" in models.stdout, models.stderr
        again = kvcake("up", "--netns", "--detach", "--config", str(cfg))
        assert again.returncode == 2  # one cluster per run_dir, as without --netns
        status = kvcake("status", "--config", str(cfg), timeout=60)
        assert status.returncode == 0 and f"netns {ns}" in status.stdout, status.stdout
        assert "proxy" in status.stdout and "master" in status.stdout
        # Supervised like `kvcake up`: a SIGKILLed instance comes back on its host and port.
        victim = st["processes"]["decode-0"]["pid"]
        os.kill(victim, signal.SIGKILL)
        dec: dict[str, Any] = {}

        def restarted() -> bool:
            now = json.loads((tmp_path / "runs" / "latest.json").read_text())
            dec.update(now["processes"]["decode-0"])
            return dec["restarts"] >= 1 and dec["pid"] != victim and alive(dec["pid"])

        wait_until(restarted, timeout=120, every_s=0.5, what="decode-0 restarted",
                   detail=lambda: dec)  # fmt: skip
        ask = ("import httpx,sys; r = httpx.post(sys.argv[1] + '/v1/completions', timeout=60,"
               " json={'prompt': 'hello', 'max_tokens': 4}); print(r.status_code)")  # fmt: skip
        last = [""]

        def answered() -> bool:
            out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", ask, url],
                                 capture_output=True, text=True, timeout=90)  # fmt: skip
            last[0] = out.stdout + out.stderr
            return out.stdout.strip() == "200"

        # the proxy sees the instance again once its health probe passes
        wait_until(answered, timeout=120, every_s=1.0, what="a 200 from the proxy",
                   detail=lambda: last[0])  # fmt: skip
        shown = kvcake("status", "--config", str(cfg), timeout=60).stdout
        assert re.search(r"decode-0 .* restarts [1-9]", shown), shown
    finally:
        down = kvcake("down", "--config", str(cfg), timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not (tmp_path / "runs" / "latest.json").exists()
    pids = [p["pid"] for p in st.get("processes", {}).values()] + [st.get("supervisor_pid", 0)]
    assert not [p for p in pids if p and alive(p)]
    assert set(_netns_list()) <= before, "namespaces left behind"
