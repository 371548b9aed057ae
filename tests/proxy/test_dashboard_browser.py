"""The dashboard in a real browser: Debian's headless Chromium (installed by ``make chromium``,
part of ``make test``) loads ``/dashboard`` from a live emulated cluster after traffic stopped,
and every value it rendered is checked against one snapshot of the JSON and of ``/metrics``
taken just before. It also saves a screenshot (``KVCAKE_DASHBOARD_SCREENSHOT=path`` keeps it;
docs/img/dashboard.png was taken this way).

Chromium is a required part of this suite: without it the test fails and says how to install
it, it is not skipped."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvcake.core.promtext import parse_metrics, total
from kvcake.launch.launcher import Cluster
from tests.cluster import make_cluster
from tests.waits import wait_until

PREFIX = "a shared system prompt that every request of the dashboard test starts with " * 4
VOID = {"meta", "link", "br", "img", "input", "hr", "source", "wbr", "col"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    parts: list[str] = field(default_factory=list)
    children: list[Node] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.parts).strip()

    def walk(self) -> list[Node]:
        out = [self]
        for c in self.children:
            out += c.walk()
        return out

    def find(self, **attrs: str) -> list[Node]:
        want = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [n for n in self.walk() if all(n.attrs.get(k) == v for k, v in want.items())]

    def one(self, **attrs: str) -> Node:
        found = self.find(**attrs)
        assert len(found) == 1, (attrs, len(found))
        return found[0]

    def field(self, name: str) -> Node:
        return self.one(data_field=name)


class Dom(HTMLParser):
    """The dumped DOM as a tree; every node's text includes its descendants' text."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Node("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        for n in self.stack:
            n.parts.append(data)


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is not installed: run `make chromium` (Debian: apt-get install "
                    "chromium); the dashboard's browser test is a required part of make test")  # fmt: skip
    return exe


def browse(
    url: str, profile: Path, *args: str, budget_ms: int = 15000
) -> subprocess.CompletedProcess[str]:
    argv = ["nice", "-n", "10", chromium(), "--headless", "--no-sandbox", "--disable-gpu",
            "--no-first-run", "--disable-extensions", "--disable-dev-shm-usage",
            f"--user-data-dir={profile}", "--window-size=1400,1500", *args]  # fmt: skip
    if budget_ms:  # 0: real time (the DOM is dumped at the load event)
        argv.append(f"--virtual-time-budget={budget_ms}")
    argv.append(url)
    return subprocess.run(argv, capture_output=True, text=True, timeout=180)


def drive_traffic(url: str) -> None:
    """Requests sharing a prefix (so later ones reuse KV), some streamed."""
    for i in range(8):
        body: dict[str, Any] = {"prompt": PREFIX + f"question {i % 3} " * 8, "max_tokens": 4 + i,
                                "temperature": 0, "stream": i % 2 == 1}  # fmt: skip
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text


def wait_idle(url: str) -> None:
    def idle() -> bool:
        rows = httpx.get(url + "/v1/cluster").json()["instances"]
        return all(r["running"] == 0 and r["queued"] == 0 for r in rows)

    wait_until(idle, timeout=30, every_s=0.1, what="the cluster idle")
    time.sleep(1.5)  # a load-report poll and a history sample after the last request


def size(v: float | None) -> str:
    """The page's byte sizes: KiB below 1 MiB, MiB below 1 GiB, GiB above."""
    if v is None:
        return "–"
    if v >= 2**30:
        return f"{v / 2**30:.2f} GiB"
    return f"{v / 2**20:.1f} MiB" if v >= 2**20 else f"{v / 2**10:.1f} KiB"


def pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def ms(v: float | None) -> str:
    return "–" if v is None else f"{1000 * v:.1f} ms"


def last_rate(snap: dict[str, Any], tier: str) -> float | None:
    vals = [p["hit_rate"].get(tier) for p in snap["hit_rate"]["points"]]
    vals = [v for v in vals if v is not None]
    return vals[-1] if vals else None


def check_page(dom: Node, snap: dict[str, Any], metrics: dict[Any, float]) -> None:
    body = next(n for n in dom.walk() if n.tag == "body")
    assert int(body.attrs["data-rendered"]) >= 1, "the page never rendered a snapshot"
    assert dom.one(id="status").attrs["data-ready"] == "true"
    for inst in snap["instances"]:
        row = dom.one(data_instance=inst["id"])
        assert row.field("role").text == inst["role"]
        assert row.field("alive").text == ("up" if inst["alive"] else "down")
        assert row.field("kv_used").text == f"{inst['kv_used']}/{inst['kv_total']}"
        assert row.field("restarts").text == str(inst["restarts"])
        for k in ("running", "queued", "indexed_blocks"):
            assert row.field(k).text == str(inst[k]), k
        assert row.field("kv_pct").text.endswith(pct(inst["kv_pct"]))
    for proc in snap["processes"]:
        row = dom.one(data_process=proc["name"])
        assert row.field("restarts").text == str(proc["restarts"])
    # Request counters: the page, the JSON and /metrics agree.
    stats = {n.attrs["data-stat"]: n.text for n in dom.walk() if "data-stat" in n.attrs}
    assert stats["finished"] == f"{total(metrics, 'kvcake:request_success_total'):.0f}"
    assert stats["finished"] == f"{snap['requests']['finished']:.0f}"
    assert stats["prompt_tokens"] == f"{total(metrics, 'kvcake:prompt_tokens_total'):.0f}"
    assert stats["rejected"] == f"{total(metrics, 'kvcake_proxy_request_rejections_total'):.0f}"
    hits = total(metrics, "kvcake:prefix_cache_hits_total")
    queries = total(metrics, "kvcake:prefix_cache_queries_total")
    assert stats["hit_rate"] == pct(hits / queries) == pct(snap["requests"]["hit_rate"])
    for reason, n in snap["rejections"].items():
        assert dom.one(data_reason=reason).field("count").text == f"{n:.0f}"
    # Hit rate over time: one line per tier, the legend shows the last interval's rate.
    assert int(dom.one(id="hitrate").attrs["data-points"]) >= 1
    for tier in snap["hit_rate"]["tiers"]:
        item = next(n for n in dom.find(data_tier=tier) if n.tag == "span")
        assert item.text.startswith(f"{tier}: {pct(last_rate(snap, tier))}"), item.text
    # Pool: every segment and tier of every storage node.
    assert snap["pool"]["segments"], "the emulated cluster has a storage node"
    for seg in snap["pool"]["segments"]:
        row = dom.one(data_segment=seg["name"], data_tier=seg["tier"])
        assert row.field("used").attrs["data-value"] == str(seg["used"])
        assert row.field("capacity").text == size(seg["capacity"])
        assert row.field("used").text == size(seg["used"])
    # Hottest blocks with their replicas and the instances caching them.
    assert snap["hot_blocks"], "the pool holds the prompts' blocks"
    for b in snap["hot_blocks"]:
        row = dom.one(data_key=b["key"])
        assert row.field("block").text == b["block"]
        assert int(row.field("replicas").attrs["data-count"]) == len(b["replicas"])
        assert row.field("holders").text == (", ".join(b["holders"]) or "–")
        assert row.field("size").text == size(b["size"])
    # The timeline of recent requests: TTFT, TBT and where their KV came from.
    rows = [n for n in dom.walk() if n.tag == "tr" and "data-request" in n.attrs]
    assert [r.attrs["data-request"] for r in rows] == [r["id"] for r in snap["recent"]]
    for req, row in zip(snap["recent"], rows, strict=True):
        assert row.field("ttft_s").text == ms(req["ttft_s"])
        assert row.field("tbt_s").text == ms(req["tbt_s"])
        assert row.field("kv").text == " · ".join(f"{k} {v}" for k, v in req["kv"].items())
        assert row.field("output_tokens").text == str(req["output_tokens"])
    bars = [n for n in dom.walk() if n.tag == "rect" and "data-request" in n.attrs]
    assert len(bars) == 3 * len(snap["recent"])
    # Both charts have axes with units.
    assert [n.text for n in dom.find(**{"class": "yaxis"})[0].children] == ["100%", "50%", "0%"]
    for chart in ("hitrate-x", "timeline-x"):
        labels = dom.one(id=chart).attrs["data-labels"].split("|")
        assert len(labels) == 3 and all(lb == "now" or lb.endswith(" s") for lb in labels), labels


@pytest.fixture(scope="module")
def round_robin_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """2 prefill instances taking turns (round-robin: the prefix another instance holds is
    recomputed, a miss reason the page shows), 1 decode, a storage node."""
    c = make_cluster(
        tmp_path_factory.mktemp("dash"),
        cluster={"prefill": 2, "decode": 1, "store_servers": 1, "store_size": "64MB"},
        conductor={"prefill_policy": "round-robin", "admission_policy": "none"},
    )
    with c:
        yield c


def test_chromium_renders_the_snapshot(round_robin_cluster: Cluster, tmp_path: Path) -> None:
    exe = chromium()
    assert subprocess.run([exe, "--version"], capture_output=True, timeout=60).returncode == 0
    url = round_robin_cluster.url
    drive_traffic(url)
    wait_idle(url)
    # One snapshot of the JSON and of /metrics; nothing talks to the proxy until the page does.
    snap = httpx.get(url + "/dashboard/api/snapshot").json()
    metrics = parse_metrics(httpx.get(url + "/metrics").text)
    assert any(r["cached_tokens"] > 0 for r in snap["recent"]), "no request reused KV"
    page = f"{url}/dashboard?stream=0"  # one snapshot: the DOM settles, nothing keeps loading
    dump = browse(page, tmp_path / "profile", "--dump-dom")
    assert dump.returncode == 0 and "<body" in dump.stdout, dump.stderr[-2000:]
    parser = Dom()
    parser.feed(dump.stdout)
    check_page(parser.root, snap, metrics)
    shot = tmp_path / "dashboard.png"
    r = browse(page, tmp_path / "profile", f"--screenshot={shot}")
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    keep = os.environ.get("KVCAKE_DASHBOARD_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)


def test_the_live_page_follows_the_stream(emulated_cluster: Cluster, tmp_path: Path) -> None:
    """With the stream on, the page renders the fetched snapshot and then SSE snapshots (a
    short bounded stream, so the headless browser's virtual time can run out)."""
    page = f"{emulated_cluster.url}/dashboard?interval=0.2&max_events=3"
    dump = browse(page, tmp_path / "profile", "--dump-dom", budget_ms=5000)
    assert dump.returncode == 0, dump.stderr[-2000:]
    parser = Dom()
    parser.feed(dump.stdout)
    body = next(n for n in parser.root.walk() if n.tag == "body")
    assert body.attrs.get("data-stream-ended") == "1", "the bounded stream did not end"
    assert int(body.attrs["data-rendered"]) == 1 + 3, "fetched snapshot + 3 stream events"


def test_the_live_page_has_data_at_once(emulated_cluster: Cluster, tmp_path: Path) -> None:
    """With the live stream on (the default page, no bound on the stream, no virtual time):
    the DOM the browser has at its load event already shows a snapshot, rendered within 2 s
    of navigation. (Before, the first data waited for the fetch or the stream: headless
    Chromium dumped "connecting…".)"""
    url = emulated_cluster.url
    assert httpx.post(url + "/v1/completions", json={"prompt": PREFIX, "max_tokens": 3},
                      timeout=60).status_code == 200  # fmt: skip
    t0 = time.monotonic()
    dump = browse(f"{url}/dashboard", tmp_path / "profile", "--dump-dom", "--timeout=10000",
                  budget_ms=0)  # fmt: skip
    took = time.monotonic() - t0
    assert dump.returncode == 0 and "<body" in dump.stdout, dump.stderr[-2000:]
    parser = Dom()
    parser.feed(dump.stdout)
    body = next(n for n in parser.root.walk() if n.tag == "body")
    assert int(body.attrs["data-rendered"]) >= 1, "no data at load: the page waited"
    assert int(body.attrs["data-first-render-ms"]) < 2000, body.attrs
    status = parser.root.one(id="status")
    assert status.attrs["data-ready"] == "true" and status.text == "ready"
    assert parser.root.find(data_instance="decode-0"), "the instances table is filled"
    print(
        f"first render {body.attrs['data-first-render-ms']} ms after navigation; "
        f"browser run {took:.1f} s"
    )
