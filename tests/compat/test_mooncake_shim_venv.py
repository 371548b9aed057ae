"""The switch as a user makes it, in a fresh venv: ``kvcake mooncake-shim install`` there,
``status`` naming what that interpreter imports, the stand-in ``mooncake_master`` started with
the command line of Mooncake's scripts, a user's script written for the wheel run unchanged by
the venv's Python, and ``uninstall`` leaving the venv as it was.

The venv is made without pip (``python -m venv --without-pip``, about a second) and sees
kvcake and its dependencies through a ``.pth`` file naming this interpreter's import path, as
if kvcake were installed there (installing it and its dependencies anew would take minutes)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from kvcake.core.ports import free_port
from tests.compat.test_mooncake_programs import Prog, started

__all__ = ["started"]  # fixture

USER_SCRIPT = """
import asyncio, os, sys
from mooncake.store import MooncakeDistributedStore, ReplicateConfig
from mooncake.async_store import MooncakeDistributedStoreAsync

store = MooncakeDistributedStoreAsync()
name = os.environ["LOCAL_HOSTNAME"]
rc = store.setup(name, os.environ["MC_METADATA_SERVER"], 64 << 20, 16 << 20, "tcp", "",
                 os.environ["MASTER_SERVER"])
assert rc == 0, rc
config = ReplicateConfig()
config.replica_num = 1
assert store.put("user-key", b"written by a script for the wheel", config) == 0
assert store.get("user-key") == b"written by a script for the wheel"
desc = store.get_replica_desc("user-key")[0].get_memory_descriptor().buffer_descriptor
assert desc.transport_endpoint == name, desc.transport_endpoint
assert asyncio.run(store.async_is_exist("user-key")) == 1
store.close()
print("user script ok", MooncakeDistributedStore.__module__)
"""


def _venv(tmp: Path) -> Path:
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)  # fmt: skip
    site = Path(
        sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    )  # the new venv's site-packages (same Python version as this one)
    ours = [p for p in sys.path if p and Path(p).is_dir() and "site-packages" in p]
    src = Path(__file__).resolve().parents[2] / "src"
    (site / "kvcake-from-repo.pth").write_text("\n".join([str(src), *ours]) + "\n")
    return venv


def _snapshot(venv: Path) -> set[str]:
    return {str(p.relative_to(venv)) for p in venv.rglob("*") if "__pycache__" not in p.parts}


def _shim(py: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(py), "-m", "kvcake", "mooncake-shim", *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_fresh_venv_install_run_uninstall(tmp_path: Path, started: list[Prog]) -> None:
    venv = _venv(tmp_path)
    py = venv / "bin" / "python"
    before = _snapshot(venv)
    status = _shim(py, "status")
    assert status.returncode == 1 and "active: none" in status.stdout, status
    installed = _shim(py, "install")
    assert installed.returncode == 0, installed.stderr
    status = _shim(py, "status")
    assert status.returncode == 0, status.stderr
    assert f"active: kvcake shim ({venv.resolve()}/lib/" in status.stdout
    assert f"program mooncake_master: kvcake ({venv}/bin/mooncake_master)" in status.stdout
    # kvcake's own interpreter asked about the venv says the same
    other = subprocess.run([sys.executable, "-m", "kvcake", "mooncake-shim", "status",
                            "--python", str(py)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert other.returncode == 0 and f"python: {py}" in other.stdout, other
    assert "active: kvcake shim" in other.stdout

    rpc, meta, metrics = free_port(), free_port(), free_port()
    master = Prog(
        str(venv / "bin" / "mooncake_master"), f"--rpc_port={rpc}",
        "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
        f"--http_metadata_server_port={meta}", f"--metrics_port={metrics}",
        "--default_kv_lease_ttl=1000",
    )  # fmt: skip
    started.append(master)
    master.wait_line("master rpc=")
    env = {
        "PATH": f"{venv}/bin:/usr/bin:/bin", "MASTER_SERVER": f"127.0.0.1:{rpc}",
        "MC_METADATA_SERVER": f"http://127.0.0.1:{meta}/metadata",
        "LOCAL_HOSTNAME": f"localhost:{free_port()}", "HOME": os.environ.get("HOME", "/root"),
    }  # fmt: skip
    run = subprocess.run([str(py), "-c", USER_SCRIPT], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "user script ok kvcake.compat.mooncake.store"
    assert master.stop() == 0

    removed = _shim(py, "uninstall")
    assert removed.returncode == 0, removed.stderr
    assert _snapshot(venv) == before  # nothing of the shim left, nothing else touched
    assert "active: none" in _shim(py, "status").stdout


def test_status_names_the_wheel(tmp_path: Path) -> None:
    wheel = os.environ.get("KVCAKE_MOONCAKE_PYTHON")
    if not wheel:
        import pytest

        pytest.skip("the Mooncake wheel venv is not installed (set KVCAKE_MOONCAKE_PYTHON)")
    out = subprocess.run([sys.executable, "-m", "kvcake", "mooncake-shim", "status", "--python",
                          wheel], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "active: real Mooncake 0.3.13" in out.stdout
    assert "program mooncake_master: NOT kvcake (left alone)" in out.stdout
