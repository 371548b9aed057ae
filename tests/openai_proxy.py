"""A second proxy over the shared emulated cluster's instances, with its own [proxy] settings
(model aliases, a small context and body limit), for the OpenAI surface tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from kvcake.launch.launcher import Cluster
from tests.waits import wait_until

MODELS = ("kvcake-test", "alias-b")
CONTEXT = 300
BODY_LIMIT = 1 << 20


@contextmanager
def extra_proxy(cluster: Cluster, tmp: Path, **proxy: object) -> Iterator[str]:
    settings = {"served_model_name": list(MODELS), "max_prompt_tokens": CONTEXT,
                "max_body_bytes": BODY_LIMIT, "poll_interval_s": 0.05, **proxy}  # fmt: skip
    cfg = tmp / "proxy.toml"
    lines = ["[kv]", f"kv_block_tokens = {cluster.conf.kv.kv_block_tokens}", "[proxy]"]
    for k, v in settings.items():
        val = "[" + ", ".join(f'"{x}"' for x in v) + "]" if isinstance(v, list) else v
        lines.append(f'{k} = "{val}"' if isinstance(v, str) else f"{k} = {val}")
    lines += ["[conductor]", 'admission_policy = "none"']
    cfg.write_text("\n".join(lines) + "\n")
    urls = cluster.instance_urls
    argv = [sys.executable, "-m", "kvcake", "proxy", "--config", str(cfg), "--backend",
            "emulated", "--port", "0"]  # fmt: skip
    for name, url in urls.items():
        argv += ["--decode" if name.startswith("decode") else "--prefill", url]
    log = (tmp / "proxy.log").open("w")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[-1].removesuffix("/v1")
        wait_until(lambda: httpx.get(url + "/health", timeout=2).status_code == 200, timeout=60,
                   every_s=0.1, ignore=(httpx.HTTPError,), what="the extra proxy healthy")  # fmt: skip
        yield url
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()
