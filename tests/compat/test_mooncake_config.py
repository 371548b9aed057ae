"""``mooncake.mooncake_config`` (the shim's ``MooncakeConfig``): the same results as the wheel's
for sizes, booleans, the file and the environment forms; with the wheel installed
(``KVCAKE_MOONCAKE_PYTHON``) the same probe runs in its venv and both must agree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.compat.test_mooncake_table import wheel_python

PROBE = r"""
import json, os, sys
from mooncake.mooncake_config import MooncakeConfig, _parse_segment_size as size_of
from mooncake.mooncake_config import _parse_bool as bool_of
import dataclasses

def res(fn, *a):
    try:
        r = fn(*a)
        return dataclasses.asdict(r) if dataclasses.is_dataclass(r) else r
    except Exception as exc:
        return "EXC:" + type(exc).__name__

out = {}
for s in [4096, "4096", "16MB", "16 MB", "16mb", "16m", "1.5GB", "2kb", "3b", "1e3", "50%", "", "GB"]:
    out["size " + repr(s)] = res(size_of, s)
for b in [True, 0, "true", "Yes", "off", "", None, "maybe"]:
    out["bool " + repr(b)] = res(bool_of, b)
for k in [k for k in os.environ if k.startswith("MOONCAKE_")]:
    del os.environ[k]
out["env none"] = res(MooncakeConfig.load_from_env)
os.environ.update(MOONCAKE_MASTER="127.0.0.1:5", MOONCAKE_PROTOCOL="TCP",
                  MOONCAKE_GLOBAL_SEGMENT_SIZE="1GB", MOONCAKE_OFFLOAD_ENABLED="yes")
out["env master"] = res(MooncakeConfig.load_from_env)
os.environ["MOONCAKE_LOCAL_BUFFER_SIZE"] = "-1"
out["env negative"] = res(MooncakeConfig.load_from_env)
for name, cfg in json.loads(sys.argv[1]).items():
    path = os.path.join(sys.argv[2], name + ".json")
    with open(path, "w") as fh:
        json.dump(cfg, fh)
    os.environ["MOONCAKE_CONFIG_PATH"] = path
    out["file " + name] = res(MooncakeConfig.load_from_env)
print(json.dumps(out, sort_keys=True))
"""
FILES = {
    "full": {
        "local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "master_server_address": "m:1",
        "global_segment_size": "512MB", "local_buffer_size": 0, "protocol": "tcp",
        "device_name": "", "tenant_id": 7, "client_http_port": "9400",
    },
    "missing_master": {"local_hostname": "h", "metadata_server": "P2PHANDSHAKE"},
    "empty_host": {"local_hostname": " ", "metadata_server": "x", "master_server_address": "m:1"},
    "bad_bool": {
        "local_hostname": "h", "metadata_server": "x", "master_server_address": "m:1",
        "enable_ssd_offload": "sometimes",
    },
}  # fmt: skip
# What the wheel 0.3.13.post1 answers (checked against it when the wheel is installed).
EXPECTED = {
    "size 4096": 4096, "size '4096'": 4096, "size '16MB'": 16 << 20, "size '16 MB'": 16 << 20,
    "size '16mb'": 16 << 20, "size '16m'": 16 << 20, "size '1.5GB'": 3 << 29,
    "size '2kb'": 2048, "size '3b'": 3, "size '1e3'": 1000, "size '50%'": "EXC:ValueError",
    "size ''": "EXC:ValueError", "size 'GB'": "EXC:ValueError",
    "bool True": True, "bool 0": False, "bool 'true'": True, "bool 'Yes'": True,
    "bool 'off'": False, "bool ''": False, "bool None": False, "bool 'maybe'": "EXC:ValueError",
    "env none": "EXC:ValueError", "env negative": "EXC:ValueError",
    "file missing_master": "EXC:ValueError", "file empty_host": "EXC:ValueError",
    "file bad_bool": "EXC:ValueError",
}  # fmt: skip


def run_probe(python: str, tmp: Path, env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run(
        [python, "-c", PROBE, json.dumps(FILES), str(tmp)],
        capture_output=True, text=True, timeout=120, env={**os.environ, **env}, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(json.loads(out.stdout))


@pytest.fixture(scope="module")
def kvcake_result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    from kvcake.compat.mooncake import shim

    shim_dir = shim.install(tmp_path_factory.mktemp("shim")).parent
    return run_probe(sys.executable, tmp_path_factory.mktemp("cfg"), {"PYTHONPATH": str(shim_dir)})


def test_shim_config_matches_wheel_rules(kvcake_result: dict[str, object]) -> None:
    got = kvcake_result
    assert {k: got[k] for k in EXPECTED} == EXPECTED
    master = got["env master"]
    assert isinstance(master, dict)
    assert master["protocol"] == "tcp" and master["global_segment_size"] == 1 << 30
    assert master["metadata_server"] == "P2PHANDSHAKE" and master["local_hostname"] == "localhost"
    assert master["enable_ssd_offload"] is True and master["local_buffer_size"] == 1 << 30
    full = got["file full"]
    assert isinstance(full, dict)
    assert full["tenant_id"] == "7" and full["client_http_port"] == 9400
    assert full["global_segment_size"] == 512 << 20


@pytest.mark.peer
def test_wheel_config_agrees(kvcake_result: dict[str, object], tmp_path: Path) -> None:
    py = wheel_python()
    if py is None:
        pytest.skip("the Mooncake wheel venv is not installed (set KVCAKE_MOONCAKE_PYTHON)")
    wheel = run_probe(py, tmp_path, {})
    diff = {k: (kvcake_result.get(k), v) for k, v in wheel.items() if kvcake_result.get(k) != v}
    assert not diff and set(wheel) == set(kvcake_result), json.dumps(diff, indent=1)
