"""A storage node on another host than its master, SIGKILLed and restarted at once under its
name: the master cannot check the dead predecessor's pid, the successor can (same host) and
says so, so the node is back at once instead of being refused until the predecessor's lease
expires (the nemesis found restarted nodes exiting with "already owned" in 12 of 20 schedules).
The second case: the master restarted too (a leader change), so its directory no longer names
the holder; the refused mount does.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from kvcake.launch.netns import Network
from tests.store.procs import Proc, spawn

PUT = r"""
import json, sys
from kvcake.store.client import Client
from kvcake.store.config import ClientConfig
c = Client(ClientConfig(master=sys.argv[1], hostname=sys.argv[2], protocol="tcp", segment_size=0))
c.put("after", b"y" * 5000)
print(json.dumps({"seg": c.get_replica_desc("after").replicas[0].segment,
                  "ok": bytes(c.get("after")) == b"y" * 5000}))
c.close()
"""


@pytest.fixture
def hosts() -> Iterator[tuple[Network, dict[str, str], list[Proc]]]:
    net = Network(["master", "node", "client"])
    env = dict(net.env(), KVCAKE_AUTH_SECRET=secrets.token_hex(16))
    started: list[Proc] = []
    with net:
        try:
            yield net, env, started
        finally:
            for p in reversed(started):
                p.stop()


def _node(net: Network, env: dict[str, str], rpc: str, wait_s: str) -> Proc:
    flags = ("--master", rpc, "--hostname", net["node"].addr, "--segment-size", "4MiB",
             "--name", "node-a", "--http-port", "-1", "--name-wait-s", wait_s)  # fmt: skip
    wrap = lambda argv: net.command("node", argv)  # noqa: E731
    return spawn("store-server", *flags, ready="store-server", timeout=60, wrap=wrap, env=env)


def _master(net: Network, env: dict[str, str], *flags: str) -> Proc:
    return spawn("master", "--host", net["master"].addr, "--port", "0", "--http-port", "-1",
                 "--client-ttl-s", "30", *flags, ready="master", timeout=60,
                 wrap=lambda argv: net.command("master", argv), env=env)  # fmt: skip


def _restart_node_at_once(
    net: Network, env: dict[str, str], master: Proc, started: list[Proc]
) -> None:
    t0 = time.monotonic()
    # --name-wait-s 0: refused at once unless the master believed the successor's report
    started.append(_node(net, env, master.info["rpc"], "0"))
    assert time.monotonic() - t0 < 15  # (the lease would take 30 s)
    assert any("gone on their host" in line for line in master.lines), "".join(master.lines)
    _put_through(net, env, master.info["rpc"])


@pytest.mark.timeout(120)
def test_node_restarted_on_its_host_gets_its_name_back_at_once(hosts) -> None:  # type: ignore[no-untyped-def]
    net, env, started = hosts
    started.append(master := _master(net, env))
    started.append(_node(net, env, master.info["rpc"], "0"))
    started[-1].stop(signal.SIGKILL)
    _restart_node_at_once(net, env, master, started)


@pytest.mark.timeout(150)
def test_node_restarted_after_its_master_gets_its_name_back_at_once(hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Node and master SIGKILLed; the master restarts from its state dir, knowing the node's
    segment (owner, host) but with an empty directory; then the node restarts."""
    net, env, started = hosts
    state = ("--state-dir", str(tmp_path / "state"))
    started.append(old := _master(net, env, *state))
    started.append(_node(net, env, old.info["rpc"], "0"))
    started[-1].stop(signal.SIGKILL)
    old.stop(signal.SIGKILL)
    started.append(master := _master(net, env, *state))
    _restart_node_at_once(net, env, master, started)


def _put_through(net: Network, env: dict[str, str], rpc: str) -> None:
    cmd = net.command("client", [sys.executable, "-c", PUT, rpc, net["client"].addr])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, **env))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"seg": "node-a", "ok": True}
