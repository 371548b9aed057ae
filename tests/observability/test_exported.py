"""Every series the Grafana dashboard queries is exported by a live cluster; the scrape config
``kvcake deploy scrape-config`` derives from ``cluster.json`` reaches every process."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvcake.deploy.grafana import grafana_dashboard, queried_exprs
from kvcake.deploy.render import local_targets, prometheus_config
from kvcake.launch.launcher import Cluster

_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
PROMPT = "the cache keeps what the prompt said before " * 8


def scrape(cluster: Cluster) -> dict[str, set[str]]:
    """job -> every series name a scrape of that job's targets can return."""
    state = json.loads((Path(cluster.run_dir) / "cluster.json").read_text())
    prom = prometheus_config(local_targets(state))
    out: dict[str, set[str]] = {}
    for job in prom["scrape_configs"]:
        for host in job["static_configs"][0]["targets"]:
            r = httpx.get(f"http://{host}{job['metrics_path']}", timeout=10)
            assert r.status_code == 200, (job["job_name"], host)
            names = out.setdefault(job["job_name"], set())
            for fam in text_string_to_metric_families(r.text):
                names |= {s.name for s in fam.samples}  # series with values
                names |= {fam.name + s for s in _SUFFIXES.get(fam.type, ())}  # declared ones
    return out


def test_every_dashboard_series_is_exported(emulated_cluster: Cluster) -> None:
    c = emulated_cluster
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0}
    for _ in range(2):  # the second one reuses the first's KV: hit counters move
        assert httpx.post(c.url + "/v1/completions", json=body, timeout=60).status_code == 200
    exported = scrape(c)
    assert set(exported) == {"kvcake-proxy", "kvcake-prefill", "kvcake-decode", "kvcake-master",
                             "kvcake-store"}  # fmt: skip
    everything = set().union(*exported.values())
    queried = {
        name
        for e in queried_exprs(grafana_dashboard())
        for name in re.findall(r"\bkvcake[:_][A-Za-z0-9_:]*", e)
    }
    assert len(queried) >= 25
    missing = sorted(queried - everything)
    assert not missing, f"dashboard queries series nobody exports: {missing}"
    # Each process kind feeds at least one panel (none of the scrape jobs is dead weight).
    for job, names in exported.items():
        assert queried & names, f"no panel uses {job}'s metrics"
    assert "kvcake:prefix_cache_hits_total" in exported["kvcake-proxy"]


def test_the_check_catches_an_unexported_name(emulated_cluster: Cluster) -> None:
    everything = set().union(*scrape(emulated_cluster).values())
    assert "kvcake:no_such_series_total" not in everything
    assert "kvcake:prefix_cache_hits" not in everything  # a counter without _total is wrong


def test_scrape_config_command(emulated_cluster: Cluster, tmp_path: Path) -> None:
    import yaml

    from kvcake.cli import main

    out = tmp_path / "prometheus.yml"
    state = Path(emulated_cluster.run_dir) / "cluster.json"
    assert main(["deploy", "scrape-config", "--state", str(state), "--out", str(out)]) == 0
    jobs = {j["job_name"]: j for j in yaml.safe_load(out.read_text())["scrape_configs"]}
    assert len(jobs["kvcake-decode"]["static_configs"][0]["targets"]) == 2
    assert jobs["kvcake-proxy"]["static_configs"][0]["targets"] == [
        emulated_cluster.url.split("//", 1)[1]
    ]
    assert main(["deploy", "scrape-config", "--state", str(tmp_path / "none.json")]) == 2
