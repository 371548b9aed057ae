"""``kvcake deploy render``: manifests valid against the Kubernetes schemas (offline, the
schemas ship inside ``kubernetes-validate``), wired to each other, and the committed
``deploy/`` equal to a fresh render of ``configs/cluster.toml``."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate as kv
import pytest
import yaml

from kvcake.cli import main
from kvcake.core.config import load_config
from kvcake.serve.config import ProxyConfig
from kvcake.serve.launcher import load_serve_file

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


@pytest.mark.parametrize("toml", [None, DISAGG, COLOC], ids=["default", "disagg", "colocated"])
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
            assert c["readinessProbe"]["httpGet"]["path"] == "/health"
            assert c["livenessProbe"]["httpGet"]["path"] in ("/health", "/v1/models")
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
    for toml in (DISAGG, COLOC):
        for o in objects(render(tmp_path, toml)):
            if o["kind"] not in ("StatefulSet", "Deployment"):
                continue
            (c,) = o["spec"]["template"]["spec"]["containers"]
            assert c["command"] == ["kvcake"]
            args = [a.replace("$(POD_IP)", "10.1.2.3").replace("$(POD_NAME)", "p-0")
                    for a in c["args"]]  # fmt: skip
            ns = parser.parse_args(args)
            assert callable(ns.func), args
            env = {e["name"] for e in c["env"]}
            assert {"POD_IP", "POD_NAME"} <= env
