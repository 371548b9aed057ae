"""An instance process (``kvcake prefill`` / ``decode`` / ``both``): its backend, KV blocks, prefill worker and decode loop."""
