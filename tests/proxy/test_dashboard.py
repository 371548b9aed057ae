"""``/dashboard`` on the proxy: the snapshot agrees with ``/v1/cluster`` and ``/metrics``, the
SSE stream is bounded and frees its slot when the client leaves, malformed parameters get a
clear 400, the static files are served from the package (and shipped in it), offline."""

from __future__ import annotations

import contextlib
import fnmatch
import json
import re
import shutil
import time
import tomllib
from pathlib import Path

import httpx
import pytest

from kvcake.core.promtext import parse_metrics, total
from kvcake.launch.launcher import Cluster
from kvcake.proxy.dashboard.history import History, Sample, tier_tokens
from kvcake.proxy.dashboard.routes import MAX_STREAMS
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "src" / "kvcake" / "proxy" / "dashboard" / "static"
PROMPT = "the dashboard shows where each request's KV came from " * 6


def _idle(url: str, timeout_s: float = 20.0) -> None:
    def idle() -> bool:
        rows = httpx.get(url + "/v1/cluster").json()["instances"]
        return all(r["running"] == 0 and r["queued"] == 0 for r in rows)

    wait_until(idle, timeout=timeout_s, every_s=0.1, what="the cluster idle")


def test_snapshot_agrees_with_cluster_view_and_metrics(emulated_cluster: Cluster) -> None:
    url = emulated_cluster.url
    last = {}
    for i in range(3):
        body = {"prompt": PROMPT + str(i), "max_tokens": 3, "temperature": 0}
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        last = r.json()["usage"]
    _idle(url)
    time.sleep(0.3)  # one more load-report poll
    snap = httpx.get(url + "/dashboard/api/snapshot", params={"recent": 3}).json()
    view = httpx.get(url + "/v1/cluster").json()
    m = parse_metrics(httpx.get(url + "/metrics").text)
    assert snap["version"] == 1 and snap["ready"] is True
    rows = {r["id"]: r for r in snap["instances"]}
    assert set(rows) == {r["id"] for r in view["instances"]}
    for v in view["instances"]:
        s = rows[v["id"]]
        assert (s["role"], s["alive"], s["kv_used"], s["kv_total"]) == (
            v["role"], v["alive"], v["kv_used"], v["kv_total"])  # fmt: skip
        assert s["indexed_blocks"] == v["cached_blocks"]
    req = snap["requests"]
    assert req["finished"] == total(m, "kvcake:request_success_total") >= 3
    assert req["prompt_tokens"] == total(m, "kvcake:prompt_tokens_total")
    hits, q = (
        total(m, "kvcake:prefix_cache_hits_total"),
        total(m, "kvcake:prefix_cache_queries_total"),
    )
    assert req["hit_rate"] == pytest.approx(hits / q)
    newest = snap["recent"][0]
    assert len(snap["recent"]) == 3
    assert newest["prompt_tokens"] == last["prompt_tokens"]
    assert newest["cached_tokens"] == last["prompt_tokens_details"]["cached_tokens"]
    assert sum(v for k, v in newest["kv"].items() if not k.startswith("miss:")) == (
        newest["prompt_tokens"])  # every prompt token has exactly one source  # fmt: skip
    assert newest["ttft_s"] > 0 and newest["output_tokens"] == 3


def test_pool_processes_and_hot_blocks_come_from_the_run_and_the_master(
    emulated_cluster: Cluster,
) -> None:
    url = emulated_cluster.url
    body = {"prompt": PROMPT + "pool", "max_tokens": 2, "temperature": 0}
    assert httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 200
    _idle(url)
    state = json.loads((Path(emulated_cluster.run_dir) / "cluster.json").read_text())
    master = "http://" + state["processes"]["master"]["addresses"]["http"]
    snap = httpx.get(url + "/dashboard/api/snapshot", params={"hot": 5}).json()
    assert snap["errors"] == [], snap["errors"]
    segs = httpx.get(master + "/get_all_segments").json()
    assert {(s["name"], s["tier"], s["capacity"]) for s in snap["pool"]["segments"]} == {
        (s["name"], s["tier"], s["capacity"]) for s in segs}  # fmt: skip
    assert all(i["restarts"] == 0 for i in snap["instances"])  # from the supervisor's record
    assert {p["name"] for p in snap["processes"]} >= {"master", "store-0", "proxy"}
    hot = httpx.get(master + "/hot_keys", params={"limit": 5}).json()
    assert 1 <= len(snap["hot_blocks"]) <= 5
    assert [b["key"] for b in snap["hot_blocks"]] == [h["key"] for h in hot]
    for b in snap["hot_blocks"]:
        assert b["replicas"] and all(r["segment"] for r in b["replicas"])
        assert len(b["block"]) == 16
    assert any(b["holders"] for b in snap["hot_blocks"])  # the prefill instance's own cache
    for bad in ("0", "x", "1001", "-3"):
        r = httpx.get(master + "/hot_keys", params={"limit": bad})
        assert r.status_code == 400 and "limit" in r.json()["error"], bad


def test_malformed_query_parameters_get_a_clear_400(emulated_cluster: Cluster) -> None:
    url = emulated_cluster.url
    bad = [
        ("snapshot", {"recent": "abc"}, "recent"), ("snapshot", {"recent": "0"}, "recent"),
        ("snapshot", {"recent": "100000"}, "recent"), ("snapshot", {"hot": "-1"}, "hot"),
        ("snapshot", {"recent": "1.5"}, "recent"), ("stream", {"interval": "nan"}, "interval"),
        ("stream", {"interval": "inf"}, "interval"), ("stream", {"interval": "0"}, "interval"),
        ("stream", {"interval": ""}, "interval"), ("stream", {"max_events": "many"}, "max_events"),
        ("stream", {"max_events": "0"}, "max_events"),
    ]  # fmt: skip
    for ep, params, name in bad:
        r = httpx.get(f"{url}/dashboard/api/{ep}", params=params, timeout=10)
        assert r.status_code == 400, (ep, params, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"].startswith(name), err
    assert httpx.get(url + "/dashboard/api/snapshot").status_code == 200  # still serving


def _events(text: str) -> list[tuple[str, str]]:
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        out.append((fields.get("event", ""), fields.get("data", "")))
    return out


def test_stream_is_bounded_and_ends(emulated_cluster: Cluster) -> None:
    params = {"interval": "0.1", "max_events": "3", "recent": "2"}
    with httpx.stream("GET", emulated_cluster.url + "/dashboard/api/stream", params=params,
                      timeout=30) as r:  # fmt: skip
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    evs = _events(text)
    assert [e for e, _ in evs] == ["snapshot"] * 3 + ["end"]
    assert all('"instances"' in d for _, d in evs[:3])


def test_streams_are_capped_and_a_gone_client_frees_its_slot(emulated_cluster: Cluster) -> None:
    url = emulated_cluster.url + "/dashboard/api/stream"
    params = {"interval": "0.2", "max_events": "3600"}
    readers = []  # kept: a dropped line iterator closes its connection
    with contextlib.ExitStack() as stack:
        for _ in range(MAX_STREAMS):
            c = stack.enter_context(httpx.Client(timeout=30))
            s = stack.enter_context(c.stream("GET", url, params=params))
            assert s.status_code == 200
            readers.append(s.iter_lines())
            next(readers[-1])  # the stream started: it holds a slot
        with httpx.stream("GET", url, params=params, timeout=10) as r:
            assert r.status_code == 429, "a stream over the cap was accepted"
            assert json.loads(r.read())["error"]["type"] == "too_many_streams"

    def a_stream_gets_a_slot() -> bool:
        with httpx.stream("GET", url, params={"interval": "0.1", "max_events": "1"},
                          timeout=10) as r:  # fmt: skip
            if r.status_code == 200:
                r.read()
            return r.status_code == 200

    # each server loop notices within one interval
    wait_until(a_stream_gets_a_slot, timeout=10, every_s=0.2,
               what="the slots of the closed streams freed")  # fmt: skip


def test_page_and_static_files_are_served_offline(emulated_cluster: Cluster) -> None:
    url = emulated_cluster.url
    page = httpx.get(url + "/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for src in re.findall(r'(?:src|href)="([^"]+)"', page.text):
        assert src.startswith("/dashboard/static/"), src  # nothing from another host
        assert httpx.get(url + src).status_code == 200, src
    for name in ("nope.js", "..%2Fsnapshot.py", "index.html%00"):
        assert httpx.get(f"{url}/dashboard/static/{name}").status_code == 404, name
    for f in STATIC.iterdir():
        text = f.read_text()
        links = re.findall(r"https?://[^\s\"'`)]+", text)
        assert links in ([], ["http://www.w3.org/2000/svg"]), (f.name, links)  # an XML name


def test_static_files_are_package_data() -> None:
    """A non-editable install ships the page: every static file matches a package-data glob."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = conf["tool"]["setuptools"]["package-data"]["kvcake"]
    for f in STATIC.iterdir():
        rel = f.relative_to(ROOT / "src" / "kvcake").as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} not in package-data {globs}"


def test_history_rates_per_tier_and_a_restart_is_dropped() -> None:
    h = History(capacity=4)

    def s(at: float, q: float, hits: float, local: float, fin: float) -> Sample:
        return Sample(at, q, {"all": hits, "local": local}, fin, 0.0)

    for smp in (s(0, 0, 0, 0, 0), s(1, 100, 40, 10, 2), s(2, 100, 40, 10, 2), s(3, 10, 5, 0, 1)):
        h.add(smp)
    pts = h.points()
    assert [p["hit_rate"] for p in pts] == [
        {"all": 0.4, "local": 0.1},
        {"all": None, "local": None},
    ]
    assert pts[0]["finished_per_s"] == 2.0
    h.add(s(4, 30, 15, 0, 2))  # capacity 4: the oldest sample is forgotten
    assert len(h.samples) == 4 and h.points()[-1]["hit_rate"]["all"] == 0.5
    with pytest.raises(ValueError):
        History(capacity=1)


def test_tiers_come_from_the_attribution_counters() -> None:
    t = "kvcake_proxy_kv_tier_tokens_total"
    series = {
        ("kvcake:prefix_cache_hits_total", ()): 30.0,
        ("kvcake:prefix_cache_queries_total", ()): 100.0,
        (t, (("node", ""), ("tier", "local"))): 20.0,
        (t, (("node", "s0"), ("tier", "pool_dram"))): 6.0,
        (t, (("node", "s1"), ("tier", "pool_dram"))): 4.0,
        (t, (("node", ""), ("tier", "computed"))): 70.0,
    }
    assert tier_tokens(series) == (100.0, {"all": 30.0, "local": 20.0, "pool_dram": 10.0})
    series = {k: v for k, v in series.items() if k[0] != t}
    assert tier_tokens(series) == (100.0, {"all": 30.0})  # no attribution: hits / queries


def test_run_record_finds_the_ha_leader_and_tolerates_bad_files(tmp_path: Path) -> None:
    from kvcake.proxy.dashboard.sources import read_run_record

    doc = {
        "processes": {
            "master-0": {"alive": True, "restarts": 1, "addresses": {"name": "m0"}},
            "master-1": {"alive": True, "restarts": 0, "addresses": {"http": "127.0.0.1:9"}},
            "prefill-0": {"alive": True, "restarts": 2, "addresses": {}},
        },
        "instances": {"prefill-0": "http://127.0.0.1:7/"},
    }
    f = tmp_path / "cluster.json"
    f.write_text(json.dumps(doc))
    rec = read_run_record(str(f))
    assert rec.master_http == "127.0.0.1:9"  # master-0 gave no HTTP address
    doc["processes"]["master-0"]["addresses"]["http"] = "127.0.0.1:8"
    f.write_text(json.dumps(doc))
    assert read_run_record(str(f)).master_http == "127.0.0.1:8,127.0.0.1:9"  # asked in turn
    assert rec.restarts_of_url("http://127.0.0.1:7") == 2 and rec.restarts_of_url("x") is None
    f.write_text("{not json")
    assert "cannot read" in read_run_record(str(f)).error
    assert read_run_record(str(tmp_path / "none.json")).error == ""  # not under kvcake up


def test_an_unreachable_master_is_reported_not_raised() -> None:
    import asyncio
    import socket

    from kvcake.proxy.dashboard.sources import read_pool

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go() -> str:
        async with httpx.AsyncClient(timeout=1.0) as http:
            return (await read_pool(http, f"127.0.0.1:{port}", 5)).error

    err = asyncio.run(go())
    assert err.startswith(f"master 127.0.0.1:{port}:"), err


@pytest.mark.slow  # its own cluster: etcd, 2 masters, an election (~30 s idle, ~2 min loaded)
@pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd not installed (make etcd)")
def test_ha_cluster_the_pool_comes_from_the_elected_master(tmp_path: Path) -> None:
    """`[ha]`: two masters on etcd; the dashboard finds the leader's admin HTTP in the run
    record (the standby has none) and shows the pool and its hottest blocks."""
    from tests.cluster import make_cluster

    c = make_cluster(tmp_path, cluster={"prefill": 1, "decode": 1, "store_servers": 1,
                                        "store_size": "32MB"}, ha={"etcd": True, "masters": 2})  # fmt: skip
    with c:
        body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}
        assert httpx.post(c.url + "/v1/completions", json=body, timeout=60).status_code == 200
        _idle(c.url)
        snap = httpx.get(c.url + "/dashboard/api/snapshot").json()
        assert snap["errors"] == [], snap["errors"]
        assert {"master-0", "master-1", "etcd"} <= {p["name"] for p in snap["processes"]}
        assert [s["name"] for s in snap["pool"]["segments"]] == ["store-0"]
        assert snap["hot_blocks"] and all(b["replicas"] for b in snap["hot_blocks"])
        # The leader dies: the page follows the pool to the master elected next (every
        # master's admin address is in the run record; only the leader answers).
        leader = next(ch for ch in c.children if ch.name.startswith("master-") and
                      _answers(ch.info.get("http", "")))  # fmt: skip
        leader.proc.kill()  # type: ignore[union-attr]
        snap = {}  # the last snapshot seen

        def follows() -> bool:
            snap.update(httpx.get(c.url + "/dashboard/api/snapshot").json())
            return not snap["errors"] and [s["name"] for s in snap["pool"]["segments"]] == [
                "store-0"
            ]

        wait_until(follows, timeout=120, every_s=1.0, what="the pool of the next leader",
                   detail=lambda: snap.get("errors"))  # fmt: skip
        assert not snap["errors"] and [s["name"] for s in snap["pool"]["segments"]] == [
            "store-0"
        ], snap["errors"]


def _answers(address: str) -> bool:
    if not address:
        return False
    try:
        return httpx.get(f"http://{address}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
