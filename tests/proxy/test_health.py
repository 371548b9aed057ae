"""Health tells the truth (issue 31): liveness apart from readiness; readiness from active
checks naming what failed; `kvcake status`, `kvcake top`, the dashboard and the
`kvcake_proxy_cluster_ready` gauge say the same."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvcake.core.promtext import find, parse_metrics
from kvcake.launch.launcher import Cluster
from kvcake.transfer.metadata import DirectoryClient
from tests.cluster import make_cluster
from tests.waits import wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # No directory heartbeat to speak of: the test takes a segment away and puts it back itself.
    c = make_cluster(tmp_path_factory.mktemp("health"),
                     cluster={"store_servers": 1, "store_size": "64MB"},
                     instance={"directory_heartbeat_s": 3600.0})  # fmt: skip
    with c:
        yield c


def ready(c: Cluster) -> httpx.Response:
    return httpx.get(c.url + "/health/ready", timeout=10)


def gauge(c: Cluster, name: str) -> float:
    (got,) = find(parse_metrics(httpx.get(c.url + "/metrics", timeout=10).text), name)
    return got[1]


def cli(*args: str) -> str:
    env = dict(os.environ, COLUMNS="250")
    r = subprocess.run([sys.executable, "-m", "kvcake", *args], capture_output=True, text=True,
                       timeout=60, env=env)  # fmt: skip
    return r.stdout + r.stderr


def views(c: Cluster) -> dict[str, str]:
    """What `kvcake status`, `kvcake top` and the dashboard say about health."""
    snap = httpx.get(c.url + "/dashboard/api/snapshot", timeout=10).json()
    return {
        "status": cli("status", "--run-dir", str(Path(c.conf.cluster.run_dir))),
        "top": cli("top", "--once", "--state", str(Path(c.run_dir) / "cluster.json")),
        "dashboard": " ".join(snap["health"]["failed"]) or "ready",
    }


def test_ready_cluster_is_live_and_ready(cluster: Cluster) -> None:
    c = cluster
    r = wait_until(
        lambda: (r := ready(c)).status_code == 200 and r, timeout=15, every_s=0.1, what="ready"
    )
    assert set(r.json()["checks"]) == {"instances", "peers", "master", "directory"}
    assert all(ch["ok"] for ch in r.json()["checks"].values())
    assert httpx.get(c.url + "/health/live").json() == {"status": "alive"}
    assert gauge(c, "kvcake_proxy_cluster_ready") == 1.0
    v = views(c)
    assert "ready" in v["status"] and "NOT READY" not in v["status"]
    assert "ready" in v["top"] and "NOT READY" not in v["top"] and v["dashboard"] == "ready"


def test_a_segment_missing_from_the_directory_is_named(cluster: Cluster) -> None:
    c = cluster
    wait_until(lambda: ready(c).status_code == 200, timeout=15, every_s=0.1, what="ready")
    d = DirectoryClient(c.child("master").info["directory"])
    info = d.lookup("kv/decode-0")
    assert d.unpublish("kv/decode-0", info.owner)
    try:
        r = wait_until(
            lambda: (r := ready(c)).status_code == 503 and r,
            timeout=15,
            every_s=0.1,
            what="not ready",
        )
        body = r.json()
        assert body["failed"] == ["directory"] and "kv/decode-0" in body["error"]["message"]
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert httpx.get(c.url + "/health/live").status_code == 200  # never on a peer
        assert gauge(c, "kvcake_proxy_cluster_ready") == 0.0
        # Requests fail now; the failure rate is shown, but it is not what makes us unready.
        bad = httpx.post(c.url + "/v1/completions", json={"prompt": [7] * 40, "max_tokens": 2},
                         timeout=30)  # fmt: skip
        assert bad.status_code == 503 and "unknown segment" in bad.text
        snap = httpx.get(c.url + "/dashboard/api/snapshot", timeout=10).json()
        row = snap["recent"][0]  # the dashboard lists the failed request, with its reason
        assert row["finish"] == "error" and "unknown segment 'kv/decode-0'" in row["error"]
        body = wait_until(lambda: (b := ready(c).json())["recent_failures"] and b,
                          timeout=15, every_s=0.1, what="a recent failure")  # fmt: skip
        assert body["failed"] == ["directory"]
        assert any("requests failed" in why for why in body["reasons"])
        assert gauge(c, "kvcake_proxy_recent_request_failure_ratio") > 0
        v = views(c)
        for what in ("status", "top"):
            assert "NOT READY: directory" in v[what] and "kv/decode-0" in v[what], v[what]
        assert v["dashboard"] == "directory"
    finally:
        d.publish(info)
        d.close()
    wait_until(lambda: ready(c).status_code == 200, timeout=15, every_s=0.1, what="ready")


def test_a_silent_peer_fails_readiness_not_liveness(cluster: Cluster) -> None:
    c = cluster
    wait_until(lambda: ready(c).status_code == 200, timeout=15, every_s=0.1, what="ready")
    proc = c.child("decode-0").proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGSTOP)
    # Resumed before the master's client TTL (10 s) runs out: past it the master drops the
    # paused process's directory entries too (its DirectoryWatch, off in this module's
    # cluster, would publish them again within a heartbeat).
    try:
        body = wait_until(lambda: "peers" in (b := ready(c).json()).get("failed", []) and b,
                          timeout=9, every_s=0.1, what="peers failed")  # fmt: skip
        assert "decode-0" in body["checks"]["peers"]["detail"]
        assert httpx.get(c.url + "/health/live", timeout=2).status_code == 200
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    try:
        wait_until(lambda: ready(c).status_code == 200, timeout=20, every_s=0.1, what="ready again")
    except AssertionError:
        raise AssertionError(ready(c).text) from None
