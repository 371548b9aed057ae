"""kvcake: KV-cache-centric disaggregated LLM serving."""

__version__ = "0.1.0"

# No `_created` series from any kvcake process (issue 16): they double every counter's
# series count and Prometheus needs none of them.
try:
    import prometheus_client as _prom

    _prom.disable_created_metrics()
except ImportError:  # pragma: no cover - a core dependency
    pass
