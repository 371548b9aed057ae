"""Prometheus metrics of the proxy, with vLLM's meanings under the ``kvcake:`` prefix
(ecosystem.md). One registry per proxy so tests can run several in one process.

Request-level series carry vLLM's ``model_name`` label (the proxy's first served name).
``names`` picks what ``/metrics`` shows: ``"kvcake"`` (default), ``"vllm"`` (every metric
vLLM also has under its ``vllm:`` name, the rest under ``kvcake:``) or ``"both"``. The
``vllm:`` series carry ``component="kvcake-proxy"`` and ``engine="kvcake-proxy"``, so a
query can tell them from (and never sums them silently with) real vLLM engines' series.
No ``_created`` series are exported (``kvcake/__init__.py`` disables them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from kvcake.conductor.predictors import Predictors
    from kvcake.serve.attribution import Attribution

NAME_MODES = ("kvcake", "vllm", "both")
COMPONENT = "kvcake-proxy"
# kvcake name -> vLLM name (vllm/v1/metrics/loggers.py); same type, same meaning.
VLLM_NAMES = {
    f"kvcake:{n}": f"vllm:{n}"
    for n in (
        "time_to_first_token_seconds", "inter_token_latency_seconds",
        "e2e_request_latency_seconds", "num_requests_running", "num_requests_waiting",
        "kv_cache_usage_perc", "prefix_cache_queries", "prefix_cache_hits", "prompt_tokens",
        "generation_tokens", "request_success", "request_queue_time_seconds",
        "request_prefill_time_seconds", "request_decode_time_seconds",
        "request_inference_time_seconds", "request_prompt_tokens",
        "request_generation_tokens", "request_params_max_tokens", "num_preemptions",
        "prompt_tokens_by_source",
    )
}  # fmt: skip


def _tokens_buckets(max_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series up to the context length."""
    out: list[float] = []
    e = 1
    while True:
        for m in (1, 2, 5):
            if m * e > max_len:
                return tuple(out)
            out.append(float(m * e))
        e *= 10


class _Bound:
    """A labelled metric with ``model_name`` fixed: ``observe``/``inc``/``labels(rest...)``."""

    def __init__(self, metric: Any, model: str):
        self._metric, self._model = metric, model
        self._child = metric.labels(model) if len(metric._labelnames) == 1 else None

    def labels(self, *values: str) -> Any:
        return self._metric.labels(self._model, *values)

    def __getattr__(self, name: str) -> Any:  # inc / observe / set / dec of the child
        if self._child is None:
            raise AttributeError(name)
        return getattr(self._child, name)


_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TBT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class ProxyMetrics:
    def __init__(self, model_name: str = "", names: str = "kvcake", max_model_len: int = 8192):
        if names not in NAME_MODES:
            raise ValueError(f"metrics names must be one of {NAME_MODES}, got {names!r}")
        self.model_name, self.names = model_name, names
        # ``registry``: every metric under kvcake's names (what in-process readers such as the
        # dashboard use); ``exposition``: what /metrics shows (per ``names``).
        r = self.registry = CollectorRegistry()
        M = ["model_name"]

        def bound(metric: Any) -> Any:
            return _Bound(metric, model_name)

        self.ttft = bound(Histogram(
            "kvcake:time_to_first_token_seconds", "Time to first token", M,
            buckets=_LATENCY, registry=r,
        ))  # fmt: skip
        self.itl = bound(Histogram(
            "kvcake:inter_token_latency_seconds", "Gap between output tokens", M, buckets=_TBT,
            registry=r,
        ))  # fmt: skip
        self.e2e = bound(Histogram(
            "kvcake:e2e_request_latency_seconds", "Request latency", M, buckets=_LATENCY,
            registry=r,
        ))  # fmt: skip
        self.running = bound(Gauge("kvcake:num_requests_running", "Requests decoding", M,
                                   registry=r))  # fmt: skip
        self.waiting = bound(Gauge(
            "kvcake:num_requests_waiting", "Requests accepted, not yet decoding", M, registry=r
        ))  # fmt: skip
        self.kv_usage = Gauge(
            "kvcake:kv_cache_usage_perc", "KV blocks in use (0-1)", ["instance"], registry=r
        )
        self.queued_prefill = Gauge(
            "kvcake_proxy_instance_queued_prefill_seconds",
            "Predicted prefill queue",
            ["instance"],
            registry=r,
        )
        self.instance_running = Gauge(
            "kvcake_proxy_instance_running_requests",
            "Requests running on an instance",
            ["instance"],
            registry=r,
        )
        self.instance_up = Gauge(
            "kvcake_proxy_instance_up",
            "1 while the instance answers",
            ["instance", "role"],
            registry=r,
        )
        # proxy/health.py: readiness from active checks (1 = ready), and per check which fail
        self.cluster_ready = Gauge("kvcake_proxy_cluster_ready", "1 while every readiness check passes",
                                   registry=r)  # fmt: skip
        self.health_check = Gauge("kvcake_proxy_health_check_ok", "1 while a readiness check passes",
                                  ["check"], registry=r)  # fmt: skip
        self.failure_ratio = Gauge(
            "kvcake_proxy_recent_request_failure_ratio",
            "Failed share of the requests of the last minute (shown, not a readiness input)",
            registry=r,
        )
        self.prefix_queries = bound(Counter(
            "kvcake:prefix_cache_queries", "Prompt tokens looked up in the KV cache", M,
            registry=r,
        ))  # fmt: skip
        self.prefix_hits = bound(Counter(
            "kvcake:prefix_cache_hits", "Prompt tokens whose KV was reused", M, registry=r
        ))  # fmt: skip
        self.prompt_tokens = bound(Counter("kvcake:prompt_tokens", "Prompt tokens", M,
                                           registry=r))  # fmt: skip
        self.generation_tokens = bound(Counter("kvcake:generation_tokens", "Generated tokens", M,
                                               registry=r))  # fmt: skip
        self.requests = bound(Counter(
            "kvcake:request_success", "Finished requests", [*M, "finished_reason"], registry=r
        ))  # fmt: skip
        self.rejections = Counter(
            "kvcake_proxy_request_rejections",
            "Requests rejected (HTTP 429)",
            ["reason"],
            registry=r,
        )
        self._request_phases(r, bound, M, max_model_len)
        self._attribution(r, bound, M)
        self.ttft_prediction_error = Histogram(
            "kvcake_proxy_ttft_prediction_error_ratio",
            "|predicted - measured| / measured TTFT of accepted requests",
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0),
            registry=r,
        )
        self.ttft_prediction_error_median = Gauge(
            "kvcake_proxy_ttft_prediction_error_median",
            "Median of the last 256 requests' |predicted - measured| / measured TTFT",
            registry=r,
        )
        self.ttft_margin = Gauge(
            "kvcake_proxy_admission_ttft_margin",
            "Factor on predicted TTFT in admission (p90 of recent measured/predicted, >= 1)",
            registry=r,
        )
        self.fitted = Gauge(
            "kvcake_proxy_cost_model_coefficient",
            "Cost-model coefficient the conductor predicts with (fitted online; seconds)",
            ["stage", "coef"],
            registry=r,
        )
        self.fit_error = Gauge(
            "kvcake_proxy_cost_model_fit_error",
            "Mean relative error of the online fit over the instances' recent samples",
            ["stage"],
            registry=r,
        )
        self.errors = Counter(
            "kvcake_proxy_request_errors", "Requests that ended with an error", ["kind"], registry=r
        )
        self.preemptions = _Preemptions(model_name)
        r.register(self.preemptions)
        self.exposition = self._exported()

    def _request_phases(self, r: CollectorRegistry, bound: Any, M: list[str], n: int) -> None:
        """vLLM's per-request phase and size histograms (the proxy's view of them)."""

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return bound(Histogram(f"kvcake:{name}", doc, M, buckets=buckets, registry=r))

        self.queue_time = hist(
            "request_queue_time_seconds",
            "Arrival to its prefill starting on an instance (waiting)",
            _LATENCY,
        )
        self.prefill_time = hist(
            "request_prefill_time_seconds", "Prefill started to first token", _LATENCY
        )
        self.decode_time = hist(
            "request_decode_time_seconds", "First token to last token", _LATENCY
        )
        self.inference_time = hist(
            "request_inference_time_seconds",
            "Prefill started to last token (prefill + decode)",
            _LATENCY,
        )
        tok = _tokens_buckets(max(n, 1))
        self.req_prompt_tokens = hist("request_prompt_tokens", "Prompt tokens per request", tok)
        self.req_generation_tokens = hist(
            "request_generation_tokens", "Generated tokens per request", tok
        )
        self.req_max_tokens = hist("request_params_max_tokens", "max_tokens per request", tok)

    def _attribution(self, r: CollectorRegistry, bound: Any, M: list[str]) -> None:
        self.tier_tokens = bound(Counter(
            "kvcake_proxy_kv_tier_tokens",
            "Prompt tokens by where their KV came from (tier local / pool_dram / ssd / computed; "
            "node = storage node for pool_dram and ssd)", [*M, "tier", "node"], registry=r,
        ))  # fmt: skip
        self.miss_tokens = bound(Counter(
            "kvcake_proxy_kv_miss_tokens", "Computed prompt tokens by why they were not reused",
            [*M, "reason"], registry=r,
        ))  # fmt: skip
        self.by_source = bound(Counter(
            "kvcake:prompt_tokens_by_source",
            "Prompt tokens by source (vLLM's: local_compute, local_cache_hit, "
            "external_kv_transfer = read from the pool)", [*M, "source"], registry=r,
        ))  # fmt: skip

    def record_attribution(self, a: Attribution) -> None:
        self.tier_tokens.labels("local", "").inc(a.local_tokens)
        for node, n in a.pool_dram_tokens.items():
            self.tier_tokens.labels("pool_dram", node).inc(n)
        for node, n in a.ssd_tokens.items():
            self.tier_tokens.labels("ssd", node).inc(n)
        self.tier_tokens.labels("computed", "").inc(a.computed_tokens)
        for reason, n in a.miss_reasons.items():
            self.miss_tokens.labels(reason).inc(n)
        external = sum(a.pool_dram_tokens.values()) + sum(a.ssd_tokens.values())
        self.by_source.labels("local_compute").inc(a.computed_tokens)
        self.by_source.labels("local_cache_hit").inc(a.local_tokens)
        self.by_source.labels("external_kv_transfer").inc(external)

    def record_phases(
        self, queue_s: float | None, prefill_s: float | None, decode_s: float | None
    ) -> None:
        for h, v in ((self.queue_time, queue_s), (self.prefill_time, prefill_s),
                     (self.decode_time, decode_s)):  # fmt: skip
            if v is not None:
                h.observe(max(0.0, v))
        if prefill_s is not None and decode_s is not None:
            self.inference_time.observe(max(0.0, prefill_s) + max(0.0, decode_s))

    def _exported(self) -> CollectorRegistry:
        if self.names == "kvcake":
            return self.registry
        out = CollectorRegistry(auto_describe=False)
        out.register(_Renamed(self.registry, keep_kvcake=self.names == "both"))
        return out

    def set_fitted(self, p: Predictors) -> None:
        pc, dc = p.prefill.coefficients, p.decode.coefficients
        for name, v in (("c0", pc.c0), ("c1", pc.c1), ("c2", pc.c2)):
            self.fitted.labels("prefill", name).set(v)
        for name, v in (("d0", dc.d0), ("d1", dc.d1), ("d2", dc.d2)):
            self.fitted.labels("decode", name).set(v)
        self.fit_error.labels("prefill").set(p.prefill.fit_error)
        self.fit_error.labels("decode").set(p.decode.fit_error)


class _Preemptions(Collector):
    """``kvcake:num_preemptions``: the sum of the instances' preemption totals (from their load
    reports), read at scrape time. ``source`` is set by the proxy once it knows the cluster."""

    def __init__(self, model: str):
        self.model = model
        self.source: Callable[[], float] = lambda: 0.0

    def collect(self) -> Iterator[Metric]:
        c = CounterMetricFamily(
            "kvcake:num_preemptions", "Decode preemptions on the instances (sum of their totals)",
            labels=["model_name"],
        )  # fmt: skip
        c.add_metric([self.model], float(self.source()))
        yield c


class _Renamed(Collector):
    """The families of ``source`` with vLLM's names where vLLM has the metric (plus the
    ``component``/``engine`` labels); the others unchanged. ``keep_kvcake``: the kvcake-named
    originals too."""

    def __init__(self, source: CollectorRegistry, keep_kvcake: bool):
        self.source, self.keep = source, keep_kvcake

    def collect(self) -> Iterator[Metric]:
        for fam in self.source.collect():
            new = VLLM_NAMES.get(fam.name)
            if new is None or self.keep:
                yield fam
            if new is None:
                continue
            out = Metric(new, fam.documentation, fam.type, fam.unit)
            extra = {"component": COMPONENT, "engine": COMPONENT}
            out.samples = [
                s._replace(name=new + s.name[len(fam.name) :], labels={**s.labels, **extra})
                for s in fam.samples
            ]
            yield out
