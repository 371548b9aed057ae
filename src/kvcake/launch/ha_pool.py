"""The store of ``kvcake up`` with ``[ha]``: an etcd, several masters, clients on ``etcd://``.

Order: etcd (``ha.etcd = true``: one member on free loopback ports, data in
``<run_dir>/etcd``; or the ``ha.etcd_endpoints`` given), ``ha.masters`` HA masters (they elect a
leader through etcd; the launcher waits for one), a standalone Transfer Engine directory for the
instances' KV links (every master hosts its own directory, which moves with the leader; the
instances' ``kv/<id>`` segments must stay findable across a failover), then the store-servers on
``etcd://HOST:PORT/<cluster>``. Killed masters are restarted by the supervisor as standbys on
fresh ports; everybody finds the leader through etcd, so nothing is pinned but etcd's ports.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from typing import TYPE_CHECKING

import httpx

from kvcake.core.errors import ConfigError
from kvcake.core.ports import free_port
from kvcake.launch.child import Child, ClusterStartError

if TYPE_CHECKING:
    from kvcake.launch.launcher import Cluster

LEADER = re.compile(r"master leader rpc=(?P<rpc>\S+) directory=(?P<directory>\S+) "
                    r"http=(?P<http>\S+) term=(?P<term>\d+)")  # fmt: skip


def etcd_alive(url: str, timeout: float = 1.0) -> bool:
    """True when etcd's v3 JSON gateway at ``url`` answers a range request."""
    with contextlib.suppress(httpx.HTTPError):
        return httpx.post(url + "/v3/kv/range", json={"key": "eA=="}, timeout=timeout).is_success
    return False


def start_etcd(cl: Cluster) -> str:
    """One etcd member on free loopback ports (a supervised child named ``etcd``); returns
    its ``host:port``."""

    exe = shutil.which("etcd")
    if exe is None:
        raise ConfigError(
            "ha.etcd = true needs the etcd binary: `make etcd` (apt-get install etcd-server), "
            "or point ha.etcd_endpoints at a running etcd"
        )
    host = "127.0.0.1"  # etcd started by kvcake up never leaves loopback
    client, peer = free_port(host), free_port(host)
    url, purl = f"http://{host}:{client}", f"http://{host}:{peer}"
    data = cl.run_dir / "etcd"
    argv = [exe, "--name", "kvcake", "--data-dir", str(data), "--listen-client-urls", url,
            "--advertise-client-urls", url, "--listen-peer-urls", purl,
            "--initial-advertise-peer-urls", purl, "--initial-cluster", f"kvcake={purl}",
            "--log-level", "warn"]  # fmt: skip
    ch = cl._spawn("etcd", argv, raw=True)
    ch.info["client"] = url
    ch.wait_until(lambda: etcd_alive(url), cl.conf.cluster.startup_timeout_s,
                  lambda: "did not start", interval_s=0.1)  # fmt: skip
    cl.say(f"  etcd         {url}")
    return f"{host}:{client}"


def start_ha_pool(cl: Cluster) -> tuple[str, str]:
    """Start etcd (if asked), the masters, the directory and the store-servers; returns
    (the instances' directory, the pool's ``etcd://`` address)."""
    c, ha = cl.conf.cluster, cl.conf.ha
    endpoints = start_etcd(cl) if ha.etcd else ha.etcd_endpoints
    http_eps = ",".join(f"http://{e}" for e in endpoints.split(","))
    flags = ["--host", c.host, "--port", "0", "--directory-port", "0",
             "--etcd-endpoints", http_eps, "--cluster", ha.cluster,
             "--ha-lease-ttl-s", str(ha.ha_lease_ttl_s)]  # fmt: skip
    # Each master gets its HTTP port up front (a standby binds it once elected, a restarted
    # one again): the run record names every master's admin address, so the dashboard and
    # scrapers find whichever one leads now.
    ports = [free_port(c.host) for _ in range(ha.masters)]
    masters = [
        cl._spawn(f"master-{i}", ["master", *flags, "--http-port", str(port)])
        for i, port in enumerate(ports)
    ]
    for m, port in zip(masters, ports, strict=True):
        cl._wait_line(m, r"master standby name=(?P<name>\S+)")
        m.info["http"] = f"{c.host}:{port}"
    leader = wait_leader(cl, masters)
    cl.say(f"  {leader.name:<12} leader rpc {leader.info['rpc']} (of {ha.masters} masters)")
    d = cl._spawn("directory", ["transfer-server", "--metadata", "--metadata-host", c.host,
                                "--metadata-port", str(c.directory_port)])  # fmt: skip
    cl._wait_line(d, r'"directory": "(?P<directory>[^"]+)"')
    addr = f"etcd://{endpoints}/{ha.cluster}"
    stores = [
        cl._spawn(f"store-{i}", ["store-server", "--master", addr, "--hostname", c.host,
                                 "--segment-size", str(c.store_size), "--name", f"store-{i}"])
        for i in range(c.store_servers)
    ]  # fmt: skip
    for s in stores:
        cl._wait_line(s, r"store-server segment=(?P<segment>\S+)(?: disk=(?P<disk>\S+))?")
    return d.info["directory"], addr


def wait_leader(cl: Cluster, masters: list[Child]) -> Child:
    """The first of ``masters`` to print its leader line (its addresses go into its info)."""

    deadline = time.monotonic() + cl.conf.cluster.startup_timeout_s
    while time.monotonic() < deadline:
        for m in masters:
            hit = LEADER.search(m.log_text())
            if hit:
                m.info.update(hit.groupdict())
                return m
            m.check_alive()
        time.sleep(0.05)
    raise ClusterStartError(masters[0].failure("no master was elected leader in time"))
