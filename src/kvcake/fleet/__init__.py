"""A fleet of vLLM engines behind kvcake's conductor (``kvcake up --config configs/vllm.toml``), P/D included."""
