"""``kvcake up`` with ``[ha] etcd = true, masters = 3``: the cluster starts its own etcd and
three HA masters, serves, and keeps serving (with pool reuse) after the leader is SIGKILLed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kvcake.launch.ha_pool import LEADER, etcd_alive
from kvcake.launch.supervisor import RestartPolicy, Supervisor
from tests.cluster import make_cluster
from tests.waits import wait_until

pytestmark = pytest.mark.skipif(
    shutil.which("etcd") is None, reason="etcd is not installed (make etcd)"
)


def _ask(url: str, prompt: list[int]) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 2, "ignore_eos": True}
    return httpx.post(url + "/v1/completions", json=body, timeout=30)


def _leader(c: object) -> tuple[int, str]:
    """The latest leader term in the masters' logs and the name of the master that won it."""
    best, name = -1, ""
    for ch in c.children:  # type: ignore[attr-defined]
        if ch.name.startswith("master-"):
            for m in LEADER.finditer(ch.log.read_text(errors="replace")):
                if int(m["term"]) > best:
                    best, name = int(m["term"]), ch.name
    return best, name


@pytest.mark.timeout(400)
def test_up_with_ha_serves_and_survives_the_leader(tmp_path: Path) -> None:
    c = make_cluster(
        tmp_path,
        cluster={"prefill": 1, "decode": 1, "store_servers": 1, "store_size": "32MB"},
        instance={"kv_blocks": 256},
        ha={"etcd": True, "masters": 3},
    )
    c.supervisor = Supervisor(c, RestartPolicy(base_s=0.2))
    block = c.conf.kv.kv_block_tokens
    with c:
        names = {ch.name for ch in c.children}
        assert {"etcd", "master-0", "master-1", "master-2", "directory", "store-0"} <= names
        etcd_url = c.child("etcd").info["client"]
        assert etcd_url.startswith("http://127.0.0.1:") and etcd_alive(etcd_url)
        inst = (c.run_dir / "prefill-0.toml").read_text()
        assert f'master = "etcd://{etcd_url.removeprefix("http://")}/kvcake"' in inst

        first = [300 + i % 50 for i in range(4 * block)]
        r = _ask(c.url, first)
        assert r.status_code == 200, r.text
        time.sleep(1.0)  # the background pool put lands
        # `kvcake status` sees etcd and the masters
        st = subprocess.run([sys.executable, "-m", "kvcake", "status", "--run-dir",
                             str(tmp_path)], capture_output=True, text=True, timeout=60)  # fmt: skip
        assert "etcd" in st.stdout and "master-2" in st.stdout, st.stdout + st.stderr
        first_leader = re.search(r"store leader: (\S+) rpc=\S+", st.stdout)
        assert first_leader, st.stdout

        old_term, old = _leader(c)
        assert old, "no leader line in the masters' logs"
        c.child(old).proc.kill()  # type: ignore[union-attr]
        new = ""

        def served_by_a_new_leader() -> bool:
            # A later term is a new leader, whichever master won it: the supervisor restarts
            # the killed one within 0.2 s, and it may win the election again.
            nonlocal new
            term, new = _leader(c)
            if term <= old_term:
                return False
            return _ask(c.url, [400 + i % 40 for i in range(2 * block)]).status_code == 200

        wait_until(served_by_a_new_leader, timeout=90, every_s=0.5,
                   what="a request served under a new leader",
                   detail=lambda: (old, new, c.child(old).log.read_text()[-1500:]))  # fmt: skip
        # a repeat of the first prompt is still served with its prefix reused
        again = _ask(c.url, first)
        assert again.status_code == 200, again.text
        cached = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= block, again.json()
        state = json.loads((c.run_dir / "cluster.json").read_text())
        assert "etcd" in state["processes"]
        # `kvcake status` names the leader of now, read from etcd
        st = subprocess.run([sys.executable, "-m", "kvcake", "status", "--run-dir",
                             str(tmp_path)], capture_output=True, text=True, timeout=60)  # fmt: skip
        now_leader = re.search(r"store leader: (\S+) rpc=\S+", st.stdout)  # host/pid
        assert now_leader and now_leader[1] != first_leader[1], st.stdout
    assert not etcd_alive(etcd_url)  # kvcake down / stop ends etcd too
    from kvcake.transfer import cleanup_stale

    cleanup_stale()
