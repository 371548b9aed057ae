"""Prometheus metrics of the proxy, with vLLM's meanings under the ``kvcake:`` prefix
(ecosystem.md). One registry per proxy so tests can run several in one process."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from kvcake.conductor.predictors import Predictors

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TBT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class ProxyMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.ttft = Histogram(
            "kvcake:time_to_first_token_seconds",
            "Time to first token",
            buckets=_LATENCY,
            registry=r,
        )
        self.itl = Histogram(
            "kvcake:inter_token_latency_seconds",
            "Gap between output tokens",
            buckets=_TBT,
            registry=r,
        )
        self.e2e = Histogram(
            "kvcake:e2e_request_latency_seconds", "Request latency", buckets=_LATENCY, registry=r
        )
        self.running = Gauge("kvcake:num_requests_running", "Requests decoding", registry=r)
        self.waiting = Gauge(
            "kvcake:num_requests_waiting", "Requests accepted, not yet decoding", registry=r
        )
        self.kv_usage = Gauge(
            "kvcake:kv_cache_usage_perc", "KV blocks in use (0-1)", ["instance"], registry=r
        )
        self.queued_prefill = Gauge(
            "kvcake:instance_queued_prefill_seconds",
            "Predicted prefill queue",
            ["instance"],
            registry=r,
        )
        self.instance_running = Gauge(
            "kvcake:instance_running_requests",
            "Requests running on an instance",
            ["instance"],
            registry=r,
        )
        self.instance_up = Gauge(
            "kvcake:instance_up", "1 while the instance answers", ["instance", "role"], registry=r
        )
        self.prefix_queries = Counter(
            "kvcake:prefix_cache_queries", "Prompt tokens looked up in the KV cache", registry=r
        )
        self.prefix_hits = Counter(
            "kvcake:prefix_cache_hits", "Prompt tokens whose KV was reused", registry=r
        )
        self.prompt_tokens = Counter("kvcake:prompt_tokens", "Prompt tokens", registry=r)
        self.generation_tokens = Counter("kvcake:generation_tokens", "Generated tokens", registry=r)
        self.requests = Counter(
            "kvcake:request_success", "Finished requests", ["finished_reason"], registry=r
        )
        self.rejections = Counter(
            "kvcake:request_rejections", "Requests rejected (HTTP 429)", ["reason"], registry=r
        )
        self.ttft_prediction_error = Histogram(
            "kvcake:ttft_prediction_error_ratio",
            "|predicted - measured| / measured TTFT of accepted requests",
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0),
            registry=r,
        )
        self.ttft_prediction_error_median = Gauge(
            "kvcake:ttft_prediction_error_median",
            "Median of the last 256 requests' |predicted - measured| / measured TTFT",
            registry=r,
        )
        self.ttft_margin = Gauge(
            "kvcake:admission_ttft_margin",
            "Factor on predicted TTFT in admission (p90 of recent measured/predicted, >= 1)",
            registry=r,
        )
        self.fitted = Gauge(
            "kvcake:cost_model_coefficient",
            "Cost-model coefficient the conductor predicts with (fitted online; seconds)",
            ["stage", "coef"],
            registry=r,
        )
        self.fit_error = Gauge(
            "kvcake:cost_model_fit_error",
            "Mean relative error of the online fit over the instances' recent samples",
            ["stage"],
            registry=r,
        )
        self.errors = Counter(
            "kvcake:request_errors", "Requests that ended with an error", ["kind"], registry=r
        )

    def set_fitted(self, p: Predictors) -> None:
        pc, dc = p.prefill.coefficients, p.decode.coefficients
        for name, v in (("c0", pc.c0), ("c1", pc.c1), ("c2", pc.c2)):
            self.fitted.labels("prefill", name).set(v)
        for name, v in (("d0", dc.d0), ("d1", dc.d1), ("d2", dc.d2)):
            self.fitted.labels("decode", name).set(v)
        self.fit_error.labels("prefill").set(p.prefill.fit_error)
        self.fit_error.labels("decode").set(p.decode.fit_error)
