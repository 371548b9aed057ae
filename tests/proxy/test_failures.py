"""Overload (429) and instance failure on real clusters of the emulated backend."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx

from kvcake.launch.launcher import Cluster
from tests.cluster import make_cluster
from tests.waits import wait_until


def test_overload_is_rejected_with_429(emulated_cluster: Cluster, tmp_path: object) -> None:
    """A second proxy over the same instances, with a 2.5 s TTFT SLO and early rejection: a
    burst of long prompts fills the prefill queue; the requests predicted to miss the SLO get
    429. (Idle, the burst's predictions are 0.42, 0.81, ... s: ~0.4 s per 4,000-token prompt;
    at 1 s a fresh clone's run once predicted even the first above it, under its load.)"""
    urls = emulated_cluster.instance_urls
    argv = [sys.executable, "-m", "kvcake", "proxy", "--backend", "emulated", "--port", "0",
            "--admission", "early-rejection", "--ttft-slo-s", "2.5",
            "--prefill", urls["prefill-0"], "--decode", urls["decode-0"],
            "--decode", urls["decode-1"]]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[-1].removesuffix("/v1")
        wait_until(lambda: httpx.get(url + "/health").status_code == 200, timeout=30,
                   every_s=0.1, ignore=(httpx.HTTPError,), what="the proxy healthy")  # fmt: skip

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=120) as http:
                bodies = [{"prompt": [400 + i] * 4000, "max_tokens": 2} for i in range(10)]
                return await asyncio.gather(*(http.post("/v1/completions", json=b) for b in bodies))

        answers = asyncio.run(burst())
        codes = [r.status_code for r in answers]
        assert 200 in codes and 429 in codes, codes
        # This burst's own refusal: a second burst may be all admitted once the proxy's online
        # fit has learnt the first one's (faster) prefill rate (seen in a fresh clone).
        r429 = next(r for r in answers if r.status_code == 429)
        err = r429.json()["error"]
        assert err["code"] == "ttft_slo" and "ttft" in err["message"].lower()
        assert err["type"] == "ttft_slo" and int(r429.headers["retry-after"]) >= 1
        assert "kvcake_proxy_request_rejections_total" in httpx.get(url + "/metrics").text
        recent = httpx.get(url + "/dashboard/api/snapshot?recent=20").json()["recent"]
        rejected = [r for r in recent if r["finish"] == "rejected"]  # listed, with the reason
        assert len(rejected) == codes.count(429) and {r["error"] for r in rejected} == {"ttft_slo"}
    finally:
        proc.terminate()
        proc.wait(10)


def test_decode_instance_killed_mid_stream(tmp_path: object) -> None:
    """Kill the decode instance serving a stream: that request ends with an error; the proxy
    stops routing to the dead instance and new requests succeed on the survivor."""
    from pathlib import Path

    c = make_cluster(Path(str(tmp_path)), cluster={"prefill": 1, "decode": 2})
    with c:
        body = {"prompt": list(range(500, 700)), "max_tokens": 2000, "stream": True}
        with httpx.stream("POST", c.url + "/v1/completions", json=body, timeout=60) as r:
            victim = r.headers["x-kvcake-decode"]
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]  # a few tokens (and blank separators)
            c.child(victim).proc.kill()  # type: ignore[union-attr]
            got += list(lines)
        events = [json.loads(ln[6:]) for ln in got if ln.startswith("data: {")]
        assert "error" in events[-1], events[-3:]
        assert victim in events[-1]["error"]["message"]
        survivor = ({"decode-0", "decode-1"} - {victim}).pop()
        for i in range(3):
            r2 = httpx.post(c.url + "/v1/completions", timeout=60,
                            json={"prompt": [600 + i] * 50, "max_tokens": 3})  # fmt: skip
            assert r2.status_code == 200, r2.text
            assert r2.headers["x-kvcake-decode"] == survivor
        view = httpx.get(c.url + "/v1/cluster").json()
        alive = {i["id"]: i["alive"] for i in view["instances"]}
        assert alive[victim] is False and alive[survivor] is True
    from kvcake.transfer import cleanup_stale

    cleanup_stale()  # the SIGKILLed instance could not remove its /dev/shm KV segment
