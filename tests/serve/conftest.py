"""Fixtures: real local clusters (separate processes on 127.0.0.1, free ports), always stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvcake.serve.launcher import Cluster, load_serve_file


def make_cluster(run_dir: Path, **sections: dict[str, Any]) -> Cluster:
    ov: dict[str, dict[str, Any]] = {
        "cluster": {"proxy_port": 0, "store_servers": 0, "run_dir": str(run_dir),
                    "startup_timeout_s": 240.0},
        "instance": {"backend": "emulated", "kv_blocks": 1024, "threads": 1},
        "proxy": {"admission": "none", "poll_interval_s": 0.05},
    }  # fmt: skip
    for name, values in sections.items():
        ov.setdefault(name, {}).update(values)
    return Cluster(load_serve_file(None, ov), run_dir=run_dir / "run", quiet=True)


@pytest.fixture(scope="session")
def emulated_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """1 prefill + 2 decode instances on the emulated backend, a store master + one node."""
    c = make_cluster(
        tmp_path_factory.mktemp("emu"),
        cluster={"prefill": 1, "decode": 2, "store_servers": 1, "store_size": "64MB"},
    )
    with c:
        yield c
