"""make_cluster: a local emulated cluster from a few config sections, for tests in any folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvcake.launch.launcher import Cluster, load_serve_file


def make_cluster(run_dir: Path, supervise: bool = False, **sections: dict[str, Any]) -> Cluster:
    ov: dict[str, dict[str, Any]] = {
        "cluster": {"proxy_port": 0, "store_servers": 0, "run_dir": str(run_dir),
                    "startup_timeout_s": 240.0},
        "instance": {"backend": "emulated", "kv_blocks": 1024, "threads": 1},
        "proxy": {"poll_interval_s": 0.05},
        "conductor": {"admission_policy": "none"},
    }  # fmt: skip
    for name, values in sections.items():
        ov.setdefault(name, {}).update(values)
    conf = load_serve_file(None, ov)
    return Cluster(conf, run_dir=run_dir / "run", quiet=True, supervise=supervise)
