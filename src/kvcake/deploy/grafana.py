"""The Grafana dashboard (``deploy/grafana/kvcake.json``) over the metrics kvcake exports: the
proxy's ``kvcake:*`` (vLLM's metrics) and ``kvcake_proxy_*``, the instances'
``kvcake_instance_*`` and the store's ``kvcake_store_*``. Built here, not hand-edited, so a test
can check every queried series."""

from __future__ import annotations

from typing import Any

_P90 = "histogram_quantile(0.9, sum by (le) (rate({m}_bucket[1m])))"
_P50 = "histogram_quantile(0.5, sum by (le) (rate({m}_bucket[1m])))"

# (title, unit, [(expr, legend)]) -- one time-series panel each, two per row.
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Requests finished / s", "reqps",
     [("sum by (finished_reason) (rate(kvcake:request_success_total[1m]))", "{{finished_reason}}"),
      ("sum by (kind) (rate(kvcake_proxy_request_errors_total[1m]))", "error {{kind}}"),
      ("sum by (reason) (rate(kvcake_proxy_request_rejections_total[1m]))", "429 {{reason}}")]),
    ("Requests running / waiting", "short",
     [("kvcake:num_requests_running", "running"), ("kvcake:num_requests_waiting", "waiting")]),
    ("Time to first token", "s",
     [(_P50.format(m="kvcake:time_to_first_token_seconds"), "p50"),
      (_P90.format(m="kvcake:time_to_first_token_seconds"), "p90")]),
    ("Inter-token latency", "s",
     [(_P50.format(m="kvcake:inter_token_latency_seconds"), "p50"),
      (_P90.format(m="kvcake:inter_token_latency_seconds"), "p90")]),
    ("End-to-end latency", "s",
     [(_P90.format(m="kvcake:e2e_request_latency_seconds"), "p90")]),
    ("Prefix-cache hit rate (prompt tokens)", "percentunit",
     [("rate(kvcake:prefix_cache_hits_total[5m]) / rate(kvcake:prefix_cache_queries_total[5m])",
       "hit rate")]),
    ("Tokens / s", "short",
     [("rate(kvcake:prompt_tokens_total[1m])", "prompt"),
      ("rate(kvcake:generation_tokens_total[1m])", "generated")]),
    ("KV cache usage per instance", "percentunit",
     [("kvcake:kv_cache_usage_perc", "{{instance}}")]),
    ("Instances up", "short", [("kvcake_proxy_instance_up", "{{instance}} ({{role}})")]),
    ("Predicted prefill queue per instance", "s",
     [("kvcake_proxy_instance_queued_prefill_seconds", "{{instance}}")]),
    ("Instance: reused vs computed prompt tokens / s", "short",
     [("sum by (instance) (rate(kvcake_instance_cached_tokens_total[1m]))", "{{instance}} reused"),
      ("sum by (instance) (rate(kvcake_instance_computed_tokens_total[1m]))",
       "{{instance}} computed")]),
    ("Instance: KV blocks in use, queued requests", "short",
     [("kvcake_instance_kv_blocks_used", "{{instance}} blocks"),
      ("kvcake_instance_queued_requests", "{{instance}} queued")]),
    ("Instance: prefill time p90", "s",
     [("histogram_quantile(0.9, sum by (le, instance) "
       "(rate(kvcake_instance_prefill_seconds_bucket[1m])))", "{{instance}}")]),
    ("TTFT prediction error (median of last 256)", "percentunit",
     [("kvcake_proxy_ttft_prediction_error_median", "median"),
      ("kvcake_proxy_admission_ttft_margin", "admission margin")]),
    ("Pool: used / capacity per segment and tier", "percentunit",
     [("kvcake_store_segment_used_bytes / kvcake_store_segment_capacity_bytes",
       "{{segment}} {{tier}}")]),
    ("Pool: objects", "short", [("kvcake_store_objects", "objects")]),
    ("Pool: evictions, offloads, promotions / s", "short",
     [("rate(kvcake_store_evicted_objects[1m])", "evicted"),
      ("rate(kvcake_store_offloads[1m])", "offloaded"),
      ("rate(kvcake_store_promotions[1m])", "promoted")]),
    ("Master RPCs / s", "reqps",
     [("sum by (op) (rate(kvcake_store_master_requests_total[1m]))", "{{op}}")]),
    ("Storage nodes: SSD tier used", "bytes",
     [("kvcake_store_node_disk_used_bytes", "{{instance}}")]),
]  # fmt: skip


def _panel(i: int, title: str, unit: str, targets: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "id": i + 1,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + k), "expr": e, "legendFormat": leg}
            for k, (e, leg) in enumerate(targets)
        ],
    }


def grafana_dashboard() -> dict[str, Any]:
    ds = {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"}
    return {
        "uid": "kvcake",
        "title": "kvcake",
        "tags": ["kvcake", "mooncake", "llm"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "5s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {"list": [ds]},
        "panels": [_panel(i, *p) for i, p in enumerate(PANELS)],
    }


def queried_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
