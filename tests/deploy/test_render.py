"""``kvcake deploy render``: manifests valid against the Kubernetes schemas (offline, the
schemas ship inside ``kubernetes-validate``), wired to each other, and the committed
``deploy/`` equal to a fresh render of ``configs/cluster.toml``."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate as kv
import pytest
import yaml

from kvcake.cli import main
from kvcake.core.config import load_config
from kvcake.launch.launcher import load_serve_file
from kvcake.serve.config import ProxyConfig

ROOT = Path(__file__).resolve().parents[2]


def render(tmp_path: Path, toml: str | None = None, *extra: str) -> Path:
    out = tmp_path / "out"
    args = ["deploy", "render", "--out", str(out), *extra]
    if toml is not None:
        cfg = tmp_path / "c.toml"
        cfg.write_text(toml)
        args += ["--config", str(cfg)]
    assert main(args) == 0
    return out


def objects(out: Path) -> list[dict[str, Any]]:
    docs = []
    for f in sorted((out / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def by(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


DISAGG = '[cluster]\nprefill = 2\ndecode = 3\nstore_servers = 2\nstore_size = "1GB"\n' \
         '[instance]\nbackend = "emulated"\nthreads = 2\n'  # fmt: skip
COLOC = "[cluster]\nprefill = 2\ncolocated = true\nstore_servers = 0\n"
HA = DISAGG + '[ha]\netcd = true\nmasters = 3\ncluster = "pool-a"\nha_lease_ttl_s = 4\n'
HA_EXT = DISAGG + '[ha]\netcd_endpoints = "etcd-a:2379,etcd-b:2379"\nmasters = 2\n'
VLLM = (ROOT / "configs" / "vllm.toml").read_text()


@pytest.mark.parametrize(
    "toml", [None, DISAGG, COLOC, HA, HA_EXT, VLLM],
    ids=["default", "disagg", "colocated", "ha-etcd", "ha-external-etcd", "vllm"],
)  # fmt: skip
def test_every_object_passes_the_kubernetes_schema(tmp_path: Path, toml: str | None) -> None:
    objs = objects(render(tmp_path, toml))
    assert len(objs) >= 5
    for o in objs:
        kv.validate(o, kv.latest_version(), strict=True)  # raises on any unknown/wrong field


def test_schema_validation_can_fail() -> None:
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"replicas": "two", "selector": {}, "template": {}}}  # fmt: skip
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kv.latest_version(), strict=True)


def test_workloads_probes_resources_and_wiring(tmp_path: Path) -> None:
    objs = objects(render(tmp_path, DISAGG, "--image", "reg.example/kvcake:1.2"))
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    for name in ("master", "store", "prefill", "decode"):
        assert ("StatefulSet", f"kvcake-{name}") in kinds and ("Service", f"kvcake-{name}") in kinds
    assert ("Deployment", "kvcake-proxy") in kinds and ("Service", "kvcake-proxy") in kinds
    assert by(objs, "StatefulSet", "kvcake-prefill")["spec"]["replicas"] == 2
    assert by(objs, "StatefulSet", "kvcake-decode")["spec"]["replicas"] == 3
    assert by(objs, "StatefulSet", "kvcake-store")["spec"]["replicas"] == 2
    for o in objs:
        if o["kind"] in ("StatefulSet", "Deployment"):
            (c,) = o["spec"]["template"]["spec"]["containers"]
            assert c["image"] == "reg.example/kvcake:1.2"
            ready, live = (
                ("/health/ready", "/health/live")
                if c["name"] == "proxy"
                else ("/health", "/health")
            )  # the proxy tells them apart (proxy/health.py)
            assert c["readinessProbe"]["httpGet"]["path"] == ready
            assert c["livenessProbe"]["httpGet"]["path"] == live
            assert c["startupProbe"]["httpGet"]["path"] == live
            assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    store = by(objs, "StatefulSet", "kvcake-store")["spec"]["template"]["spec"]["containers"][0]
    assert store["resources"]["requests"]["memory"] == f"{(10**9 >> 20) + 1 + 256}Mi"
    dec = by(objs, "StatefulSet", "kvcake-decode")["spec"]["template"]["spec"]["containers"][0]
    assert dec["resources"]["requests"]["cpu"] == "2"
    assert "kvcake-master-0.kvcake-master:50051" in dec["args"]


def test_configmap_carries_the_cluster_toml_and_a_matching_proxy_config(tmp_path: Path) -> None:
    objs = objects(render(tmp_path, DISAGG))
    data = by(objs, "ConfigMap", "kvcake-config")["data"]
    assert data["cluster.toml"] == DISAGG
    ptoml = tmp_path / "proxy.toml"
    ptoml.write_text(data["proxy.toml"])
    p = load_config(ProxyConfig, toml_path=ptoml, section="proxy")
    assert p.prefill == tuple(f"http://kvcake-prefill-{i}.kvcake-prefill:8100" for i in range(2))
    assert p.decode == tuple(f"http://kvcake-decode-{i}.kvcake-decode:8100" for i in range(3))
    assert p.master == "kvcake-master-0.kvcake-master:50051"
    assert tomllib.loads(data["proxy.toml"])["kv"]["kv_block_tokens"] == load_serve_file(
        tmp_path / "c.toml").kv.kv_block_tokens  # fmt: skip


def test_colocated_without_pool_has_no_master_and_no_decode(tmp_path: Path) -> None:
    out = render(tmp_path, COLOC)
    names = {o["metadata"]["name"] for o in objects(out)}
    assert "kvcake-colocated" in names
    assert not names & {"kvcake-master", "kvcake-store", "kvcake-decode"}
    prom = yaml.safe_load((out / "prometheus" / "prometheus.yml").read_text())
    assert [j["job_name"] for j in prom["scrape_configs"]] == ["kvcake-proxy", "kvcake-colocated"]


def test_bad_config_is_a_clear_error_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[cluster]\nprefill = 0\n")
    assert main(["deploy", "render", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "cluster.prefill" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_committed_deploy_dir_is_a_fresh_render(tmp_path: Path) -> None:
    out = render(tmp_path, (ROOT / "configs" / "cluster.toml").read_text())
    for f in out.rglob("*"):
        if f.is_file():
            rel = f.relative_to(out)
            committed = ROOT / "deploy" / rel
            assert committed.exists(), f"deploy/{rel} missing: run `kvcake deploy render`"
            assert committed.read_text() == f.read_text(), f"deploy/{rel} is stale"


def test_every_container_command_parses_with_kvcake_s_own_cli(tmp_path: Path) -> None:
    """The args in the manifests are real `kvcake` flags (a renamed flag breaks this test)."""
    from kvcake.cli import build_parser

    parser = build_parser()
    for toml in (DISAGG, COLOC, HA):
        for o in objects(render(tmp_path, toml)):
            if o["kind"] not in ("StatefulSet", "Deployment") or o["metadata"]["name"] == (
                "kvcake-etcd"):  # fmt: skip
                continue
            (c,) = o["spec"]["template"]["spec"]["containers"]
            assert c["command"] == ["kvcake"]
            args = [a.replace("$(POD_IP)", "10.1.2.3").replace("$(POD_NAME)", "p-0")
                    for a in c["args"]]  # fmt: skip
            ns = parser.parse_args(args)
            assert callable(ns.func), args
            env = {e["name"] for e in c["env"]}
            assert {"POD_IP", "POD_NAME"} <= env


def containers(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    o = next(o for o in objs if o["kind"] in ("StatefulSet", "Deployment")
             and o["metadata"]["name"] == name)  # fmt: skip
    (c,) = o["spec"]["template"]["spec"]["containers"]
    return {"replicas": o["spec"]["replicas"], **c, "_spec": o["spec"]}


def arg(c: dict[str, Any], flag: str) -> str:
    return str(c["args"][c["args"].index(flag) + 1])


def test_ha_renders_etcd_and_a_master_statefulset_on_it(tmp_path: Path) -> None:
    objs = objects(render(tmp_path, HA))
    etcd = containers(objs, "kvcake-etcd")
    assert etcd["replicas"] == 3 and etcd["command"] == ["etcd"]
    assert etcd["readinessProbe"]["httpGet"] == {"path": "/health", "port": 2379}
    init = next(a for a in etcd["args"] if a.startswith("--initial-cluster="))
    assert init.count("=http://kvcake-etcd-") == 3
    assert etcd["_spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    eps = ",".join(f"kvcake-etcd-{i}.kvcake-etcd:2379" for i in range(3))
    m = containers(objs, "kvcake-master")
    assert m["replicas"] == 3
    assert arg(m, "--etcd-endpoints") == ",".join(f"http://{e}" for e in eps.split(","))
    assert (arg(m, "--cluster"), arg(m, "--ha-lease-ttl-s")) == ("pool-a", "4")
    # A standby serves no HTTP: ready only while leading, no HTTP liveness/startup probe.
    assert m["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "livenessProbe" not in m and "startupProbe" not in m
    pool = f"etcd://{eps}/pool-a"
    assert arg(containers(objs, "kvcake-store"), "--master") == pool
    d = containers(objs, "kvcake-directory")
    assert d["args"][:2] == ["transfer-server", "--metadata"] and "tcpSocket" in d["livenessProbe"]
    for role in ("prefill", "decode"):
        c = containers(objs, f"kvcake-{role}")
        assert arg(c, "--master") == pool
        assert arg(c, "--directory") == "kvcake-directory-0.kvcake-directory:50052"
    data = by(objs, "ConfigMap", "kvcake-config")["data"]
    assert tomllib.loads(data["proxy.toml"])["proxy"]["master"] == pool
    assert tomllib.loads(data["cluster.toml"])["ha"]["masters"] == 3  # the same TOML


def test_ha_with_an_external_etcd_renders_no_etcd(tmp_path: Path) -> None:
    out = render(tmp_path, HA_EXT)
    objs = objects(out)
    assert not [o for o in objs if o["metadata"]["name"] == "kvcake-etcd"]
    m = containers(objs, "kvcake-master")
    assert m["replicas"] == 2
    assert arg(m, "--etcd-endpoints") == "http://etcd-a:2379,http://etcd-b:2379"
    assert (
        arg(containers(objs, "kvcake-store"), "--master") == "etcd://etcd-a:2379,etcd-b:2379/kvcake"
    )
    prom = yaml.safe_load((out / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "kvcake-master")
    assert len(job["static_configs"][0]["targets"]) == 2  # every master; the leader answers


def test_vllm_config_renders_engines_with_the_connector(tmp_path: Path) -> None:
    from kvcake.fleet.cluster import load
    from kvcake.fleet.procs import CONNECTOR, CONNECTOR_MODULE
    from kvcake.fleet.proxy import parse_engine

    cfg = load(ROOT / "configs" / "vllm.toml")
    out = render(tmp_path, VLLM, "--image", "reg.example/kvcake-vllm:1")
    objs = objects(out)
    for i in range(cfg.engines):  # one single-pod StatefulSet per engine
        e = containers(objs, f"kvcake-vllm-{i}")
        assert e["replicas"] == 1 and e["image"] == "reg.example/kvcake-vllm:1"
        ev = json.loads(arg(e, "--kv-events-config"))["endpoint"]
        assert ev == f"tcp://kvcake-proxy:{5557 + i}"  # vLLM connects, the proxy binds
    eng = containers(objs, "kvcake-vllm-0")
    assert eng["command"] == ["python"] and eng["args"][:2] == [
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    ktc = json.loads(arg(eng, "--kv-transfer-config"))
    assert (ktc["kv_connector"], ktc["kv_connector_module_path"]) == (CONNECTOR, CONNECTOR_MODULE)
    assert ktc["kv_connector_extra_config"] == {"master": "kvcake-master-0.kvcake-master:50051",
                                                **cfg.connector}  # fmt: skip
    assert arg(eng, "--block-size") == str(cfg.block_size) and arg(eng, "--host") == "$(POD_IP)"
    env = {e["name"]: e.get("value") for e in eng["env"]}
    assert env["VLLM_CPU_KVCACHE_SPACE"] == str(cfg.kv_cache_gib)
    assert eng["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert {"cpu", "memory"} <= set(eng["resources"]["requests"])
    vols = eng["_spec"]["template"]["spec"]["volumes"]
    assert {"name": "models", "persistentVolumeClaim": {"claimName": "kvcake-models",
                                                         "readOnly": True}} in vols  # fmt: skip
    proxy = containers(objs, "kvcake-proxy")
    assert proxy["args"][:3] == ["-m", "kvcake", "vllm-proxy"]
    engines = [parse_engine(a) for a in proxy["args"][3:] if a.startswith("vllm-")]
    assert [str(e.id) for e in engines] == [f"vllm-{i}" for i in range(cfg.engines)]
    assert [e.events for e in engines] == [
        f"tcp://$(POD_IP):{5557 + i}" for i in range(cfg.engines)
    ]
    assert [e.url for e in engines] == [
        f"http://kvcake-vllm-{i}-0.kvcake-vllm-{i}:8000" for i in range(cfg.engines)]  # fmt: skip
    svc = by(objs, "Service", "kvcake-proxy")
    assert {p["port"] for p in svc["spec"]["ports"]} >= {5557 + i for i in range(cfg.engines)}
    assert (
        arg(containers(objs, "kvcake-store"), "--master") == "kvcake-master-0.kvcake-master:50051"
    )
    assert by(objs, "ConfigMap", "kvcake-config")["data"]["vllm.toml"] == VLLM
