"""The proxy's /metrics under kvcake's and vLLM's names (serve.metrics), the settings that pick
them, and the request-log line of a rejected request (serve.reqlog)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvcake.core.errors import ConfigError
from kvcake.proxy.metrics import VLLM_NAMES, ProxyMetrics
from kvcake.proxy.reqlog import RequestLog, on_end
from kvcake.proxy.router import Outcome
from kvcake.serve.config import ProxyConfig


def families(m: ProxyMetrics) -> dict[str, list[object]]:
    text = generate_latest(m.exposition).decode()
    assert "_created" not in text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def drive(m: ProxyMetrics) -> None:
    m.prompt_tokens.inc(10)
    m.requests.labels("stop").inc()
    m.record_phases(0.1, 0.2, 0.3)
    m.req_prompt_tokens.observe(10)


def test_kvcake_names_by_default() -> None:
    m = ProxyMetrics("smol")
    drive(m)
    f = families(m)
    assert "kvcake:prompt_tokens" in f and not any(n.startswith("vllm:") for n in f)
    (s,) = f["kvcake:prompt_tokens"]
    assert s.labels == {"model_name": "smol"} and s.value == 10  # type: ignore[attr-defined]


def test_vllm_names_replace_the_ones_vllm_has() -> None:
    m = ProxyMetrics("smol", "vllm")
    drive(m)
    f = families(m)
    for kv_name, vllm_name in VLLM_NAMES.items():
        assert kv_name not in f and vllm_name in f, vllm_name
    assert "kvcake_proxy_kv_tier_tokens" in f  # no vLLM twin: kept under kvcake's name
    assert m.registry.get_sample_value("kvcake:prompt_tokens_total", {"model_name": "smol"}) == 10
    (s,) = f["vllm:prompt_tokens"]
    assert s.labels == {"model_name": "smol", "component": "kvcake-proxy",  # type: ignore[attr-defined]
                        "engine": "kvcake-proxy"}  # fmt: skip
    q = {x.name: x.value for x in f["vllm:request_queue_time_seconds"]}  # type: ignore[attr-defined]
    assert q["vllm:request_queue_time_seconds_count"] == 1
    assert q["vllm:request_queue_time_seconds_sum"] == pytest.approx(0.1)


def test_both_and_bad_modes() -> None:
    f = families(ProxyMetrics("smol", "both"))
    assert "kvcake:prompt_tokens" in f and "vllm:prompt_tokens" in f
    with pytest.raises(ValueError, match="metrics names"):
        ProxyMetrics("smol", "prometheus")
    with pytest.raises(ConfigError, match="metrics_names"):
        ProxyConfig(metrics_names="vLLM")
    with pytest.raises(ConfigError, match="request_log_max_bytes"):
        ProxyConfig(request_log_max_bytes=10)


def test_a_rejected_request_gets_a_log_line_but_no_request_histograms(tmp_path: Path) -> None:
    m = ProxyMetrics("smol")
    log = RequestLog(tmp_path / "r.jsonl")
    st = SimpleNamespace(metrics=m, request_log=log, cluster=SimpleNamespace(block_tokens=32))
    out = Outcome("req-1", 40)
    out.model, out.endpoint = "smol", "chat"
    on_end(st, out, outcome="rejected", error="ttft_slo")
    log.close()
    (line,) = (tmp_path / "r.jsonl").read_text().splitlines()
    rec = json.loads(line)
    assert rec["outcome"] == "rejected" and rec["error"] == "ttft_slo" and rec["kv"] is None
    assert rec["prompt_tokens"] == 40 and rec["ttft_s"] is None and rec["prefill"] is None
    f = families(m)
    count = [s for s in f["kvcake:request_prompt_tokens"] if s.name.endswith("_count")]  # type: ignore[attr-defined]
    assert count[0].value == 0  # type: ignore[attr-defined]
