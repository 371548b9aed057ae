"""`kvcake up --config <vllm toml>` with P/D roles (one kv_producer, one kv_consumer engine, the
layout of configs/vllm-pd.toml): the proxy prefills on one and decodes on the other. It
supervises the engines: SIGKILL the decode engine's whole process group, the supervisor starts
it again on its port, `kvcake status` counts the restart, the proxy answers again; `kvcake down`
leaves no process behind. Three engine starts (real vLLM, ~1 min each)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kvcake.fleet import shm_orphans

PROMPT = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hi."}],
          "max_tokens": 4, "temperature": 0}  # fmt: skip


def kvcake(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvcake", *args], capture_output=True, text=True, timeout=timeout
    )


def state(run_dir: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((run_dir / "latest.json").read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def mapped_segments(pid: int) -> set[str]:
    try:
        with open(f"/proc/{pid}/maps") as fh:
            return {os.path.basename(ln.split()[-1]) for ln in fh if "/dev/shm/psm_" in ln}
    except OSError:
        return set()


@pytest.mark.timeout(1800)  # three engine starts; each took 1-5 min on a loaded 2-core machine
def test_up_pd_roles_and_restart_of_a_killed_engine(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs"
    cfg = tmp_path / "vllm.toml"
    cfg.write_text(
        '[vllm]\nprefill = 1\ndecode = 1\ncpus = ["0", "1"]\nproxy_port = 0\n'
        f'kv_cache_gib = 1\nrun_dir = "{run_dir}"\nstartup_timeout_s = 600.0\n'
        '[vllm.connector]\npd_transport = "te"\nload_timeout_s = 5.0\n'
    )
    pids: list[int] = []
    try:
        up = kvcake("up", "--config", str(cfg), "--detach")
        assert up.returncode == 0, up.stdout + up.stderr
        st = state(run_dir)
        pids = [p["pid"] for p in st["processes"].values()] + [st["supervisor_pid"]]
        url = st["url"]
        r = httpx.post(url + "/v1/chat/completions", json=PROMPT, timeout=120)
        assert r.status_code == 200, r.text
        assert r.headers["x-kvcake-prefill"] == "vllm-prefill-0"  # the P/D placement
        assert r.headers["x-kvcake-engine"] == "vllm-decode-0"
        fleet = httpx.get(url + "/fleet", timeout=10).json()
        assert fleet["pd"] and fleet["engines"]["vllm-prefill-0"]["role"] == "prefill"
        engine = st["processes"]["vllm-decode-0"]
        group = [
            int(p) for p in os.listdir("/proc") if p.isdigit() and pgid(int(p)) == engine["pid"]
        ]
        queues = {n for p in group for n in mapped_segments(p)}  # its /dev/shm message queues
        assert queues, "the engine maps no psm_* segment: the leak check below would be vacuous"
        os.killpg(engine["pid"], signal.SIGKILL)  # API server, engine core and worker at once
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            e = state(run_dir)["processes"]["vllm-decode-0"]
            if e["restarts"] == 1 and e["alive"] and e["pid"] != engine["pid"]:
                break
            time.sleep(2)
        else:
            raise AssertionError(f"the decode was not restarted: {state(run_dir)['processes']}")
        assert "killed by SIGKILL" in e["last_exit"]
        # A SIGKILLed engine never unlinks its queues (~400 MB): the supervisor removed them.
        assert not [n for n in queues if (shm_orphans.SHM_DIR / n).exists()]
        pids.append(e["pid"])
        assert e["addresses"]["url"] == engine["addresses"]["url"]  # the same port again
        deadline = time.monotonic() + 120
        while True:  # the proxy notices the engine is healthy again
            r = httpx.post(url + "/v1/chat/completions", json=PROMPT, timeout=120)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert r.status_code == 200, r.text
        status = kvcake("status", "--config", str(cfg), timeout=60)
        assert status.returncode == 0 and "vllm-decode-0" in status.stdout, status.stdout
    finally:
        down = kvcake("down", "--config", str(cfg), timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in pids if alive(p)]
