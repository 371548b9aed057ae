"""SGLang HiCache L3 storage on kvcake's pool (docs/integrations/sglang.md).

``backend`` imports sglang and runs only in an SGLang environment (``make install-sglang``);
``keys`` and ``pages`` are importable without it."""
