"""Deployment files derived from one cluster file: Kubernetes manifests and a Prometheus scrape
config. Pure functions (dicts in, dicts out); :mod:`kvcake.commands.deploy` writes them.

Kubernetes layout (one object list, rendered to ``deploy/k8s/``): a ConfigMap holding the
cluster TOML verbatim (what ``kvcake up`` reads) plus the proxy's own TOML (the same file the
launcher writes into its run dir), the master as a StatefulSet, storage nodes as a StatefulSet
(stable segment names), prefill/decode instances as StatefulSets behind headless Services (the
proxy routes to each instance by its stable DNS name -- cache-aware routing needs one URL per
instance, which a Deployment's single Service cannot give), and the proxy as a Deployment with a
Service. Every process binds its pod IP and has probes on ``/health``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvcake.deploy.k8s import (
    APP,
    CONF_DIR,
    claim,
    config_map,
    container,
    dns,
    mem,
    pod_spec,
    service,
    tcp_probe,
    workload,
)
from kvcake.launch.clusterfile import toml_dump
from kvcake.serve.config import ServeFile

# Fixed in-pod ports (kvcake up picks free ones; a pod owns its network namespace).
INSTANCE_PORT = 8100
MASTER_RPC_PORT = 50051
MASTER_DIR_PORT = 50052
MASTER_HTTP_PORT = 9003
STORE_HTTP_PORT = 9100
STORE_DISK_PORT = 9101
ETCD_CLIENT_PORT, ETCD_PEER_PORT = 2379, 2380
ETCD_MEMBERS = 3  # `[ha] etcd = true`: a 3-member etcd (one member would be the single point)
ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.17"


def proxy_port(conf: ServeFile) -> int:
    return conf.cluster.proxy_port or 8000


def roles(conf: ServeFile) -> dict[str, int]:
    """Instance StatefulSets and their replica counts."""
    c = conf.cluster
    return {"colocated": c.prefill} if c.colocated else {"prefill": c.prefill, "decode": c.decode}


def master_host() -> str:
    return dns("master", 0)


def etcd_endpoints(conf: ServeFile) -> str:
    """``host:port[,...]`` of the etcd the HA masters elect through (rendered or given)."""
    if conf.ha.etcd:
        return ",".join(f"{dns('etcd', i)}:{ETCD_CLIENT_PORT}" for i in range(ETCD_MEMBERS))
    return conf.ha.etcd_endpoints


def pool_address(conf: ServeFile) -> str:
    """What store-servers, instances and the proxy give as ``--master``: the master's RPC, or
    with ``[ha]`` the ``etcd://`` address through which they follow the elected leader."""
    if conf.ha.enabled:
        return f"etcd://{etcd_endpoints(conf)}/{conf.ha.cluster}"
    return f"{master_host()}:{MASTER_RPC_PORT}"


def directory_address(conf: ServeFile) -> str:
    """The Transfer Engine directory of the instances: the master's, or with ``[ha]`` a
    standalone one (every master hosts its own, which would move with the leader)."""
    if conf.ha.enabled:
        return f"{dns('directory', 0)}:{MASTER_DIR_PORT}"
    return f"{master_host()}:{MASTER_DIR_PORT}"


def instance_urls(conf: ServeFile, role: str) -> tuple[str, ...]:
    return tuple(f"http://{dns(role, i)}:{INSTANCE_PORT}" for i in range(roles(conf).get(role, 0)))


def proxy_toml(conf: ServeFile) -> str:
    """The proxy's config as the launcher writes it, with in-cluster addresses."""
    pre = "colocated" if conf.cluster.colocated else "prefill"
    pool = conf.cluster.store_servers > 0
    p = replace(
        conf.proxy, host="0.0.0.0", port=proxy_port(conf), prefill=instance_urls(conf, pre),
        decode=instance_urls(conf, "decode"), master=pool_address(conf) if pool else "",
    )  # fmt: skip
    return toml_dump({"kv": conf.kv, "proxy": p})


def _master_objects(conf: ServeFile, image: str, ns: str) -> list[dict[str, Any]]:
    """One master, or with ``[ha]`` ``ha.masters`` of them electing a leader through etcd.
    A standby serves no HTTP until it leads, so HA masters are *ready* only while leading
    (the ``kvcake-master`` Service then reaches the leader's /metrics) and have no HTTP
    liveness probe (it would restart every standby); a master that loses etcd exits."""
    ha = conf.ha
    mports = {"rpc": MASTER_RPC_PORT, "directory": MASTER_DIR_PORT, "http": MASTER_HTTP_PORT}
    margs = ["master", "--host", "$(POD_IP)", "--port", str(MASTER_RPC_PORT),
             "--directory-port", str(MASTER_DIR_PORT), "--http-port", str(MASTER_HTTP_PORT)]  # fmt: skip
    if ha.enabled:
        eps = ",".join(f"http://{e}" for e in etcd_endpoints(conf).split(","))
        margs += ["--etcd-endpoints", eps, "--cluster", ha.cluster,
                  "--ha-lease-ttl-s", str(ha.ha_lease_ttl_s)]  # fmt: skip
    ctr = container("master", margs, mports, MASTER_HTTP_PORT,
                    {"cpu": "250m", "memory": "256Mi"}, image)  # fmt: skip
    if ha.enabled:
        del ctr["startupProbe"], ctr["livenessProbe"]
    n = ha.masters if ha.enabled else 1
    out = [service("master", mports, ns, headless=True),
           workload("StatefulSet", "master", n, pod_spec(ctr), ns)]  # fmt: skip
    if ha.enabled:  # the instances' Transfer Engine directory must outlive a failover
        dports = {"directory": MASTER_DIR_PORT}
        dargs = ["transfer-server", "--metadata", "--metadata-host", "$(POD_IP)",
                 "--metadata-port", str(MASTER_DIR_PORT), "--hostname", "$(POD_IP)"]  # fmt: skip
        d = container("directory", dargs, dports, MASTER_DIR_PORT,
                      {"cpu": "100m", "memory": "128Mi"}, image)  # fmt: skip
        d["readinessProbe"], d["livenessProbe"] = tcp_probe(MASTER_DIR_PORT), tcp_probe(
            MASTER_DIR_PORT, fails=6)  # fmt: skip
        d["startupProbe"] = tcp_probe(MASTER_DIR_PORT, period=5, fails=24)
        out += [service("directory", dports, ns, headless=True),
                workload("StatefulSet", "directory", 1, pod_spec(d), ns)]  # fmt: skip
    return out


def _etcd_objects(ns: str) -> list[dict[str, Any]]:
    """``[ha] etcd = true``: a 3-member etcd StatefulSet (stable member names, data on a
    volume claim), probes on etcd's own ``/health``."""
    peers = ",".join(
        f"{APP}-etcd-{i}=http://{dns('etcd', i)}:{ETCD_PEER_PORT}" for i in range(ETCD_MEMBERS)
    )
    args = ["--name=$(POD_NAME)", "--data-dir=/var/lib/etcd",
            f"--listen-client-urls=http://0.0.0.0:{ETCD_CLIENT_PORT}",
            f"--advertise-client-urls=http://$(POD_NAME).{APP}-etcd:{ETCD_CLIENT_PORT}",
            f"--listen-peer-urls=http://0.0.0.0:{ETCD_PEER_PORT}",
            f"--initial-advertise-peer-urls=http://$(POD_NAME).{APP}-etcd:{ETCD_PEER_PORT}",
            f"--initial-cluster={peers}", "--initial-cluster-state=new",
            f"--initial-cluster-token={APP}-etcd"]  # fmt: skip
    ports = {"client": ETCD_CLIENT_PORT, "peer": ETCD_PEER_PORT}
    ctr = container("etcd", args, ports, ETCD_CLIENT_PORT,
                    {"cpu": "250m", "memory": "512Mi"}, ETCD_IMAGE)  # fmt: skip
    ctr["command"] = ["etcd"]
    ctr["volumeMounts"] = [{"name": "data", "mountPath": "/var/lib/etcd"}]
    pod = pod_spec(ctr, config=False)
    return [service("etcd", ports, ns, headless=True),
            workload("StatefulSet", "etcd", ETCD_MEMBERS, pod, ns, [claim("data", "1Gi")])]  # fmt: skip


def _pool_objects(conf: ServeFile, image: str, ns: str) -> list[dict[str, Any]]:
    c = conf.cluster
    sargs = ["store-server", "--master", pool_address(conf),
             "--hostname", "$(POD_IP)", "--segment-size", str(c.store_size), "--name",
             "$(POD_NAME)", "--http-port", str(STORE_HTTP_PORT),
             "--disk-port", str(STORE_DISK_PORT)]  # fmt: skip
    sports = {"http": STORE_HTTP_PORT, "disk": STORE_DISK_PORT}
    store_mem = {"cpu": "250m", "memory": mem(c.store_size + (256 << 20))}
    store = container("store", sargs, sports, STORE_HTTP_PORT, store_mem, image)
    store["volumeMounts"].append({"name": "shm", "mountPath": "/dev/shm"})
    spod = pod_spec(store)
    spod["volumes"].append({"name": "shm", "emptyDir": {"medium": "Memory"}})
    return [
        *_master_objects(conf, image, ns),
        service("store", sports, ns, headless=True),
        workload("StatefulSet", "store", c.store_servers, spod, ns),
    ]


def _instance_objects(conf: ServeFile, image: str, ns: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    inst = conf.instance
    heavy = inst.backend == "torch"
    res = {"cpu": str(inst.threads), "memory": "3Gi" if heavy else "512Mi"}
    for role, n in roles(conf).items():
        args = [role, "--config", f"{CONF_DIR}/cluster.toml", "--id", "$(POD_NAME)",
                "--host", "$(POD_IP)", "--port", str(INSTANCE_PORT)]  # fmt: skip
        if conf.cluster.store_servers:
            args += ["--master", pool_address(conf), "--directory", directory_address(conf)]
        ports = {"http": INSTANCE_PORT}
        ctr = container(role, args, ports, INSTANCE_PORT, res, image)
        out.append(service(role, ports, ns, headless=True))
        out.append(workload("StatefulSet", role, n, pod_spec(ctr, grace_s=60), ns))
    return out


def _proxy_objects(conf: ServeFile, image: str, ns: str) -> list[dict[str, Any]]:
    port = proxy_port(conf)
    args = ["proxy", "--config", f"{CONF_DIR}/proxy.toml", "--backend", conf.instance.backend]
    if conf.cluster.colocated:
        args.append("--colocated")
    # Readiness (/health/ready) fails while a peer is missing; liveness (/health/live) never
    # depends on a peer: restarting the proxy would not bring an instance back (proxy/health.py).
    ctr = container("proxy", args, {"http": port}, port, {"cpu": "500m", "memory": "512Mi"},
                     image, live_path="/health/live", ready_path="/health/ready")  # fmt: skip
    svc = service("proxy", {"http": port}, ns, headless=False)
    return [svc, workload("Deployment", "proxy", 1, pod_spec(ctr), ns)]


def k8s_manifests(
    conf: ServeFile, cluster_toml: str, image: str, namespace: str = "default"
) -> dict[str, list[dict[str, Any]]]:
    """File name -> the objects it holds, for the cluster ``conf`` (read from ``cluster_toml``)."""
    cm = config_map(namespace, {"cluster.toml": cluster_toml, "proxy.toml": proxy_toml(conf)})
    files = {"00-config.yaml": [cm]}
    if conf.ha.etcd:
        files["05-etcd.yaml"] = _etcd_objects(namespace)
    if conf.cluster.store_servers:
        files["10-pool.yaml"] = _pool_objects(conf, image, namespace)
    files["20-instances.yaml"] = _instance_objects(conf, image, namespace)
    files["30-proxy.yaml"] = _proxy_objects(conf, image, namespace)
    return files


# --- Prometheus -------------------------------------------------------------------------------
def k8s_targets(conf: ServeFile) -> dict[str, list[str]]:
    """Scrape targets (job -> host:port) of the rendered Kubernetes cluster."""
    out: dict[str, list[str]] = {"proxy": [f"{APP}-proxy:{proxy_port(conf)}"]}
    for role, n in roles(conf).items():
        out[role] = [f"{dns(role, i)}:{INSTANCE_PORT}" for i in range(n)]
    if conf.cluster.store_servers:  # HA: every master; only the leader answers
        n = conf.ha.masters if conf.ha.enabled else 1
        out["master"] = [f"{dns('master', i)}:{MASTER_HTTP_PORT}" for i in range(n)]
        out["store"] = [
            f"{dns('store', i)}:{STORE_HTTP_PORT}" for i in range(conf.cluster.store_servers)
        ]
    return out


def local_targets(state: dict[str, Any]) -> dict[str, list[str]]:
    """Scrape targets of a running ``kvcake up`` cluster, from its ``cluster.json``. Storage
    nodes' HTTP addresses are only in their ready line, so they are read from their logs."""
    out: dict[str, list[str]] = {}

    def add(job: str, url: str) -> None:
        out.setdefault(job, []).append(re.sub(r"^https?://", "", url).split("/")[0])

    add("proxy", state["url"])
    for name, url in sorted(state.get("instances", {}).items()):
        add(name.rsplit("-", 1)[0], url)
    for name, proc in sorted(state.get("processes", {}).items()):
        if name == "master" and "http" in proc.get("addresses", {}):
            add("master", proc["addresses"]["http"])
        elif name.startswith("store-"):
            log = Path(state["run_dir"]) / f"{name}.log"
            m = re.search(r"store-server .*http=(\S+)", log.read_text(errors="replace"))
            if m and m.group(1) not in ("", "None"):
                add("store", m.group(1))
    return out


def prometheus_config(targets: dict[str, list[str]], interval_s: int = 5) -> dict[str, Any]:
    """One scrape job per process kind; ``component`` tells them apart in queries (and keeps
    kvcake's series apart from other exporters' in a shared Prometheus)."""
    jobs = [
        {
            "job_name": f"{APP}-{job}",
            "metrics_path": "/metrics",
            # The proxy labels per-instance series `instance=<kvcake id>`: keep that label
            # rather than letting Prometheus rename it to exported_instance.
            "honor_labels": True,
            "static_configs": [{"targets": hosts, "labels": {"component": job}}],
        }
        for job, hosts in targets.items()
    ]
    return {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
        "scrape_configs": jobs,
    }
