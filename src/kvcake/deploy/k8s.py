"""Kubernetes object builders shared by the manifests of :mod:`kvcake.deploy.render`
(kvcake's own processes, etcd, HA masters) and :mod:`kvcake.deploy.vllm_fleet` (vLLM engines
with the connector). Pure functions: dicts in, dicts out, every object namespaced and labelled
``app.kubernetes.io/name=kvcake`` + ``app.kubernetes.io/component=<component>``."""

from __future__ import annotations

from typing import Any

APP = "kvcake"
CONF_DIR = "/etc/kvcake"

POD_ENV = [
    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
]


def dns(name: str, i: int) -> str:
    """The stable name of pod ``i`` of StatefulSet ``kvcake-<name>`` (behind its headless
    Service of the same name)."""
    return f"{APP}-{name}-{i}.{APP}-{name}"


def labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": component}


def probe(port: int, path: str = "/health", period: int = 10, fails: int = 3) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": fails,
    }


def tcp_probe(port: int, period: int = 10, fails: int = 3) -> dict[str, Any]:
    """For the processes with no HTTP server (the Transfer Engine directory)."""
    return {"tcpSocket": {"port": port}, "periodSeconds": period, "failureThreshold": fails}


def container(
    component: str, args: list[str], ports: dict[str, int], health_port: int,
    resources: dict[str, str], image: str, live_path: str = "/health",
    ready_path: str = "/health",
) -> dict[str, Any]:  # fmt: skip
    """A ``kvcake <args>`` container with the config mounted and HTTP probes (``/health``
    unless the process tells liveness and readiness apart)."""
    return {
        "name": component,
        "image": image,
        "command": ["kvcake"],
        "args": args,
        "env": list(POD_ENV),
        "ports": [{"name": n, "containerPort": p} for n, p in ports.items()],
        "resources": {"requests": resources, "limits": {"memory": resources["memory"]}},
        # A model load can take minutes: the startup probe holds off the other two until then.
        "startupProbe": probe(health_port, live_path, period=5, fails=120),
        "readinessProbe": probe(health_port, ready_path, period=5),
        "livenessProbe": probe(health_port, live_path, fails=6),
        "volumeMounts": [{"name": "config", "mountPath": CONF_DIR, "readOnly": True}],
    }


def pod_spec(ctr: dict[str, Any], grace_s: int = 30, config: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": grace_s, "containers": [ctr]}
    spec["volumes"] = [{"name": "config", "configMap": {"name": f"{APP}-config"}}] if config else []
    return spec


def workload(
    kind: str, component: str, replicas: int, pod: dict[str, Any], ns: str,
    claims: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": {"matchLabels": labels(component)},
        "template": {"metadata": {"labels": labels(component)}, "spec": pod},
    }
    if kind == "StatefulSet":
        spec["serviceName"] = f"{APP}-{component}"
        spec["podManagementPolicy"] = "Parallel"
        if claims:
            spec["volumeClaimTemplates"] = claims
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": f"{APP}-{component}", "namespace": ns, "labels": labels(component)},
        "spec": spec,
    }


def service(component: str, ports: dict[str, int], ns: str, headless: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": labels(component),
        "ports": [{"name": n, "port": p, "targetPort": p} for n, p in ports.items()],
    }
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = True  # peers resolve each other while starting
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{APP}-{component}", "namespace": ns, "labels": labels(component)},
        "spec": spec,
    }


def config_map(ns: str, data: dict[str, str]) -> dict[str, Any]:
    """The one ConfigMap every pod mounts at ``CONF_DIR`` (the cluster's TOML files)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{APP}-config", "namespace": ns, "labels": labels("config")},
        "data": data,
    }


def claim(name: str, size: str) -> dict[str, Any]:
    """A volumeClaimTemplate (the cluster's default StorageClass)."""
    return {
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
    }


def mem(nbytes: int) -> str:
    return f"{max(1, -(-nbytes // (1 << 20)))}Mi"
