"""Adapters that make kvcake the KV-cache layer of other serving systems (vLLM today)."""
