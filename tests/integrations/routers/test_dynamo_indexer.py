"""NVIDIA Dynamo's real standalone KV indexer (``ai-dynamo-runtime`` 1.6.1 in its own venv,
``make install-dynamo``) subscribed to the master's vLLM-format KV events: its ``POST /query``
scores the pool (worker 1) for a prompt's prefix once a writer put the blocks with their
lineage, scores a shorter prefix after a block is removed, and none once the first block
is evicted. The indexer binds 0.0.0.0, so
everything runs inside a private network namespace (``unshare -n``, loopback only)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DYNAMO_PY = ROOT / ".venv-dynamo" / "bin" / "python"
SCRIPT = "tests.integrations.routers.dynamo_netns"


def _netns_argv() -> list[str]:
    if not DYNAMO_PY.exists():
        pytest.fail("Dynamo's venv is missing: run `make install-dynamo` (ai-dynamo-runtime "
                    "1.6.1 in .venv-dynamo); this router test is a required part of make test")  # fmt: skip
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        pytest.fail("`unshare` and `ip` are needed (util-linux, iproute2): Dynamo's indexer "
                    "binds 0.0.0.0 and runs only inside a private network namespace")  # fmt: skip
    inner = f"{ip} link set lo up && exec {sys.executable} -m {SCRIPT} {DYNAMO_PY} 8090"
    return [unshare, "-n", "sh", "-c", inner]


def test_dynamo_indexer_scores_the_pool_then_drops_removed_and_evicted_blocks() -> None:
    proc = subprocess.run(
        _netns_argv(), cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode != 0 and "Operation not permitted" in proc.stderr:
        pytest.fail(f"no private network namespace here (needs root or user namespaces): "
                    f"{proc.stderr.strip()[-300:]}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["before"]["instances"] == {}  # nothing published yet
    assert seen["put"] == [True] * 4
    assert seen["stored"]["instances"]["1"]["longest_matched"] == 64  # four blocks of 16
    assert seen["after_remove"]["instances"]["1"]["longest_matched"] == 32  # block 3 removed
    assert seen["evicted"], seen  # the master's LRU eviction took block 1 under memory pressure
    assert not seen["after_evict"]["instances"].get("1", {}).get("longest_matched"), seen
    assert not seen["after_failover"]["instances"].get("1", {}).get("longest_matched"), (
        seen,
        proc.stderr[-3000:],
    )
