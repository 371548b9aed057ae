"""Kubernetes manifests for a vLLM fleet cluster file (``configs/vllm.toml``, ``[vllm]``): what
``kvcake up --config configs/vllm.toml`` starts, as objects. A kvcake master and one storage
node (the pool), ``vllm.engines`` vLLM OpenAI servers with the KvcakeConnector (the same
``--kv-transfer-config`` as :class:`~kvcake.fleet.procs.VllmEngineSpec`, whose method
builds it) publishing their KV events, and kvcake's KV-aware vLLM proxy in front.

The engines expect an image with kvcake and the vLLM build installed (``pip install
'kvcake[vllm]'``) and the model directory on a volume claim named ``kvcake-models`` mounted at
``/models`` (``vllm.model`` = a path under it; default ``/models/smollm2``, kvcake's converted
SmolLM2 checkpoint). Engine ``i`` is the single pod of StatefulSet ``kvcake-vllm-<i>`` and
publishes its KV events to port ``5557 + i`` of the proxy, which binds them.
"""

from __future__ import annotations

import json
from typing import Any

from kvcake.core.config import parse_size
from kvcake.core.errors import ConfigError
from kvcake.deploy.k8s import (
    APP,
    POD_ENV,
    config_map,
    container,
    dns,
    mem,
    pod_spec,
    service,
    workload,
)
from kvcake.deploy.render import (
    MASTER_DIR_PORT,
    MASTER_HTTP_PORT,
    MASTER_RPC_PORT,
    STORE_DISK_PORT,
    STORE_HTTP_PORT,
)
from kvcake.fleet.cluster import VllmClusterConfig
from kvcake.fleet.procs import VllmEngineSpec

ENGINE_PORT = 8000
EVENTS_PORT = 5557
MODELS_CLAIM, MODELS_DIR = f"{APP}-models", "/models"


def proxy_port(cfg: VllmClusterConfig) -> int:
    return cfg.proxy_port or 8000


def master_address() -> str:
    return f"{dns('master', 0)}:{MASTER_RPC_PORT}"


def engine_spec(cfg: VllmClusterConfig, i: int) -> VllmEngineSpec:
    model = cfg.model or f"{MODELS_DIR}/smollm2"
    return VllmEngineSpec(
        f"vllm-{i}", ENGINE_PORT, model, cfg.served_model_name, master_address(),
        connector_extra=dict(cfg.connector), block_size=cfg.block_size,
        max_model_len=cfg.max_model_len, kv_cache_gib=cfg.kv_cache_gib,
        kv_events_port=EVENTS_PORT,
    )  # fmt: skip


def events_port(i: int) -> int:
    """The port engine ``i`` publishes its KV events to. vLLM *connects* its PUB socket to
    the endpoint and the proxy binds one per engine (fleet/adapter.py), so each engine
    has its own port on the proxy."""
    return EVENTS_PORT + i


def _engine_args(spec: VllmEngineSpec, i: int) -> list[str]:
    """vLLM's own flags (as :meth:`VllmEngineSpec.argv`), bound to the pod's IP."""
    events = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://{APP}-proxy:{events_port(i)}", "replay_endpoint": None,
              "topic": "kv-events"}  # fmt: skip
    return [
        "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model_dir,
        "--served-model-name", spec.served_name, "--host", "$(POD_IP)", "--port", str(spec.port),
        "--dtype", "float32", "--enforce-eager", "--block-size", str(spec.block_size),
        "--max-model-len", str(spec.max_model_len), "--seed", "0",
        "--kv-transfer-config", json.dumps(spec.kv_transfer_config()),
        "--kv-events-config", json.dumps(events),
    ]  # fmt: skip


def engine_host(i: int) -> str:
    return dns(f"vllm-{i}", 0)


def _engine_objects(cfg: VllmClusterConfig, image: str, ns: str) -> list[dict[str, Any]]:
    """One single-pod StatefulSet per engine (each publishes to its own proxy port, so the
    pods' command lines differ), each with its headless Service: ``kvcake-vllm-<i>-0``."""
    out: list[dict[str, Any]] = []
    for i in range(cfg.engines):
        spec = engine_spec(cfg, i)
        ports = {"http": ENGINE_PORT}
        res = {"cpu": "1", "memory": f"{cfg.kv_cache_gib + 2}Gi"}
        ctr = container("vllm", _engine_args(spec, i), ports, ENGINE_PORT, res, image)
        ctr["command"] = ["python"]
        ctr["env"] = [*POD_ENV] + [
            {"name": k, "value": v}
            for k, v in (("VLLM_CPU_KVCACHE_SPACE", str(cfg.kv_cache_gib)),
                         ("VLLM_HOST_IP", "$(POD_IP)"), ("HF_HUB_OFFLINE", "1"),
                         ("TRANSFORMERS_OFFLINE", "1"), ("VLLM_NO_USAGE_STATS", "1"),
                         ("DO_NOT_TRACK", "1"))
        ]  # fmt: skip
        ctr["volumeMounts"].append({"name": "models", "mountPath": MODELS_DIR, "readOnly": True})
        pod = pod_spec(ctr, grace_s=60)
        claim = {"claimName": MODELS_CLAIM, "readOnly": True}
        pod["volumes"].append({"name": "models", "persistentVolumeClaim": claim})
        out += [service(f"vllm-{i}", ports, ns, headless=True),
                workload("StatefulSet", f"vllm-{i}", 1, pod, ns)]  # fmt: skip
    return out


def _pool_objects(cfg: VllmClusterConfig, image: str, ns: str) -> list[dict[str, Any]]:
    mports = {"rpc": MASTER_RPC_PORT, "directory": MASTER_DIR_PORT, "http": MASTER_HTTP_PORT}
    margs = ["master", "--host", "$(POD_IP)", "--port", str(MASTER_RPC_PORT),
             "--directory-port", str(MASTER_DIR_PORT), "--http-port", str(MASTER_HTTP_PORT)]  # fmt: skip
    master = container("master", margs, mports, MASTER_HTTP_PORT,
                       {"cpu": "250m", "memory": "256Mi"}, image)  # fmt: skip
    size = parse_size(cfg.store_size)
    sargs = ["store-server", "--master", master_address(), "--hostname", "$(POD_IP)",
             "--segment-size", str(size), "--name", "$(POD_NAME)",
             "--http-port", str(STORE_HTTP_PORT), "--disk-port", str(STORE_DISK_PORT)]  # fmt: skip
    sports = {"http": STORE_HTTP_PORT, "disk": STORE_DISK_PORT}
    store = container("store", sargs, sports, STORE_HTTP_PORT,
                      {"cpu": "250m", "memory": mem(size + (256 << 20))}, image)  # fmt: skip
    store["volumeMounts"].append({"name": "shm", "mountPath": "/dev/shm"})
    spod = pod_spec(store)
    spod["volumes"].append({"name": "shm", "emptyDir": {"medium": "Memory"}})
    return [service("master", mports, ns, headless=True),
            workload("StatefulSet", "master", 1, pod_spec(master), ns),
            service("store", sports, ns, headless=True),
            workload("StatefulSet", "store", 1, spod, ns)]  # fmt: skip


def _proxy_objects(cfg: VllmClusterConfig, image: str, ns: str) -> list[dict[str, Any]]:
    port = proxy_port(cfg)
    args = ["-m", "kvcake", "vllm-proxy", "--master", master_address(), "--host", "0.0.0.0",
            "--port", str(port), "--block-tokens", str(cfg.block_size)]  # fmt: skip
    ports = {"http": port}
    for i in range(cfg.engines):
        url = f"http://{engine_host(i)}:{ENGINE_PORT}"
        args += ["--engine", f"vllm-{i}={url}@tcp://$(POD_IP):{events_port(i)}"]
        ports[f"events-{i}"] = events_port(i)
    # /health is 503 while no engine answers (readiness); /v1/cluster answers while it serves.
    ctr = container("proxy", args, ports, port, {"cpu": "500m", "memory": "512Mi"},
                    image, live_path="/v1/cluster")  # fmt: skip
    ctr["command"] = ["python"]
    return [service("proxy", ports, ns, headless=False),
            workload("Deployment", "proxy", 1, pod_spec(ctr), ns)]  # fmt: skip


def vllm_manifests(
    cfg: VllmClusterConfig, cluster_toml: str, image: str, namespace: str = "default"
) -> dict[str, list[dict[str, Any]]]:
    if cfg.prefill or cfg.decode:  # P/D fleets run under `kvcake up` only (for now)
        raise ConfigError("kvcake deploy renders [vllm] engines (kv_both) only, not prefill/decode")
    cm = config_map(namespace, {"vllm.toml": cluster_toml})
    return {
        "00-config.yaml": [cm],
        "10-pool.yaml": _pool_objects(cfg, image, namespace),
        "20-vllm.yaml": _engine_objects(cfg, image, namespace),
        "30-proxy.yaml": _proxy_objects(cfg, image, namespace),
    }


def vllm_targets(cfg: VllmClusterConfig) -> dict[str, list[str]]:
    """Scrape targets: every engine (vLLM's own ``/metrics``), the master, the storage node
    (the vLLM proxy has no ``/metrics``)."""
    return {
        "vllm": [f"{engine_host(i)}:{ENGINE_PORT}" for i in range(cfg.engines)],
        "master": [f"{dns('master', 0)}:{MASTER_HTTP_PORT}"],
        "store": [f"{dns('store', 0)}:{STORE_HTTP_PORT}"],
    }
