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

from kvcake.serve.clusterfile import toml_dump
from kvcake.serve.config import ServeFile

# Fixed in-pod ports (kvcake up picks free ones; a pod owns its network namespace).
INSTANCE_PORT = 8100
MASTER_RPC_PORT = 50051
MASTER_DIR_PORT = 50052
MASTER_HTTP_PORT = 9003
STORE_HTTP_PORT = 9100
STORE_DISK_PORT = 9101
CONF_DIR = "/etc/kvcake"
APP = "kvcake"

_POD_ENV = [
    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
]


def proxy_port(conf: ServeFile) -> int:
    return conf.cluster.proxy_port or 8000


def roles(conf: ServeFile) -> dict[str, int]:
    """Instance StatefulSets and their replica counts."""
    c = conf.cluster
    return {"colocated": c.prefill} if c.colocated else {"prefill": c.prefill, "decode": c.decode}


def _dns(name: str, i: int) -> str:
    return f"{APP}-{name}-{i}.{APP}-{name}"


def master_host() -> str:
    return _dns("master", 0)


def instance_urls(conf: ServeFile, role: str) -> tuple[str, ...]:
    return tuple(f"http://{_dns(role, i)}:{INSTANCE_PORT}" for i in range(roles(conf).get(role, 0)))


def proxy_toml(conf: ServeFile) -> str:
    """The proxy's config as the launcher writes it, with in-cluster addresses."""
    pre = "colocated" if conf.cluster.colocated else "prefill"
    pool = conf.cluster.store_servers > 0
    p = replace(
        conf.proxy, host="0.0.0.0", port=proxy_port(conf), prefill=instance_urls(conf, pre),
        decode=instance_urls(conf, "decode"),
        master=f"{master_host()}:{MASTER_RPC_PORT}" if pool else "",
    )  # fmt: skip
    return toml_dump({"kv": conf.kv, "proxy": p})


def _labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": component}


def _probe(port: int, path: str = "/health", period: int = 10, fails: int = 3) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": fails,
    }


def _container(
    component: str, args: list[str], ports: dict[str, int], health_port: int,
    resources: dict[str, str], image: str, live_path: str = "/health",
) -> dict[str, Any]:  # fmt: skip
    return {
        "name": component,
        "image": image,
        "command": ["kvcake"],
        "args": args,
        "env": _POD_ENV,
        "ports": [{"name": n, "containerPort": p} for n, p in ports.items()],
        "resources": {"requests": resources, "limits": {"memory": resources["memory"]}},
        # A model load can take minutes: the startup probe holds off the other two until then.
        "startupProbe": _probe(health_port, period=5, fails=120),
        "readinessProbe": _probe(health_port, period=5),
        "livenessProbe": _probe(health_port, live_path, fails=6),
        "volumeMounts": [{"name": "config", "mountPath": CONF_DIR, "readOnly": True}],
    }


def _pod_spec(container: dict[str, Any], grace_s: int = 30) -> dict[str, Any]:
    return {
        "terminationGracePeriodSeconds": grace_s,
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": f"{APP}-config"}}],
    }


def _workload(
    kind: str, component: str, replicas: int, pod: dict[str, Any], ns: str
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": {"matchLabels": _labels(component)},
        "template": {"metadata": {"labels": _labels(component)}, "spec": pod},
    }
    if kind == "StatefulSet":
        spec["serviceName"] = f"{APP}-{component}"
        spec["podManagementPolicy"] = "Parallel"
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": f"{APP}-{component}", "namespace": ns, "labels": _labels(component)},
        "spec": spec,
    }


def _service(component: str, ports: dict[str, int], ns: str, headless: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": _labels(component),
        "ports": [{"name": n, "port": p, "targetPort": p} for n, p in ports.items()],
    }
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = True  # peers resolve each other while starting
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{APP}-{component}", "namespace": ns, "labels": _labels(component)},
        "spec": spec,
    }


def _mem(nbytes: int) -> str:
    return f"{max(1, -(-nbytes // (1 << 20)))}Mi"


def _pool_objects(conf: ServeFile, image: str, ns: str) -> list[dict[str, Any]]:
    c = conf.cluster
    mports = {"rpc": MASTER_RPC_PORT, "directory": MASTER_DIR_PORT, "http": MASTER_HTTP_PORT}
    margs = ["master", "--host", "$(POD_IP)", "--port", str(MASTER_RPC_PORT),
             "--directory-port", str(MASTER_DIR_PORT), "--http-port", str(MASTER_HTTP_PORT)]  # fmt: skip
    master = _container("master", margs, mports, MASTER_HTTP_PORT,
                        {"cpu": "250m", "memory": "256Mi"}, image)  # fmt: skip
    sargs = ["store-server", "--master", f"{master_host()}:{MASTER_RPC_PORT}",
             "--hostname", "$(POD_IP)", "--segment-size", str(c.store_size), "--name",
             "$(POD_NAME)", "--http-port", str(STORE_HTTP_PORT),
             "--disk-port", str(STORE_DISK_PORT)]  # fmt: skip
    sports = {"http": STORE_HTTP_PORT, "disk": STORE_DISK_PORT}
    store_mem = {"cpu": "250m", "memory": _mem(c.store_size + (256 << 20))}
    store = _container("store", sargs, sports, STORE_HTTP_PORT, store_mem, image)
    store["volumeMounts"].append({"name": "shm", "mountPath": "/dev/shm"})
    spod = _pod_spec(store)
    spod["volumes"].append({"name": "shm", "emptyDir": {"medium": "Memory"}})
    return [
        _service("master", mports, ns, headless=True),
        _workload("StatefulSet", "master", 1, _pod_spec(master), ns),
        _service("store", sports, ns, headless=True),
        _workload("StatefulSet", "store", c.store_servers, spod, ns),
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
            args += ["--master", f"{master_host()}:{MASTER_RPC_PORT}",
                     "--directory", f"{master_host()}:{MASTER_DIR_PORT}"]  # fmt: skip
        ports = {"http": INSTANCE_PORT}
        ctr = _container(role, args, ports, INSTANCE_PORT, res, image)
        out.append(_service(role, ports, ns, headless=True))
        out.append(_workload("StatefulSet", role, n, _pod_spec(ctr, grace_s=60), ns))
    return out


def _proxy_objects(conf: ServeFile, image: str, ns: str) -> list[dict[str, Any]]:
    port = proxy_port(conf)
    args = ["proxy", "--config", f"{CONF_DIR}/proxy.toml", "--backend", conf.instance.backend]
    if conf.cluster.colocated:
        args.append("--colocated")
    # /health is 503 while no prefill+decode pair answers: right for readiness, wrong for
    # liveness (restarting the proxy would not bring instances back), so liveness asks
    # /v1/models, which answers whenever the process serves.
    ctr = _container("proxy", args, {"http": port}, port, {"cpu": "500m", "memory": "512Mi"},
                     image, live_path="/v1/models")  # fmt: skip
    svc = _service("proxy", {"http": port}, ns, headless=False)
    return [svc, _workload("Deployment", "proxy", 1, _pod_spec(ctr), ns)]


def k8s_manifests(
    conf: ServeFile, cluster_toml: str, image: str, namespace: str = "default"
) -> dict[str, list[dict[str, Any]]]:
    """File name -> the objects it holds, for the cluster ``conf`` (read from ``cluster_toml``)."""
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{APP}-config", "namespace": namespace, "labels": _labels("config")},
        "data": {"cluster.toml": cluster_toml, "proxy.toml": proxy_toml(conf)},
    }
    files = {"00-config.yaml": [cm]}
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
        out[role] = [f"{_dns(role, i)}:{INSTANCE_PORT}" for i in range(n)]
    if conf.cluster.store_servers:
        out["master"] = [f"{master_host()}:{MASTER_HTTP_PORT}"]
        out["store"] = [
            f"{_dns('store', i)}:{STORE_HTTP_PORT}" for i in range(conf.cluster.store_servers)
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
