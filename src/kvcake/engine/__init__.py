"""The inference engine: a real Llama-architecture model on CPU over a paged KV cache
(``TorchBackend``), a weightless ``EmulatedBackend`` with the same API, and the offline ``LLM``.

Heavy modules (torch) load lazily, so ``from kvcake.engine import EmulatedBackend`` stays light.
See docs/engine.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLM": "kvcake.engine.llm",
    "RequestOutput": "kvcake.engine.llm",
    "TorchBackend": "kvcake.engine.torch_backend",
    "EmulatedBackend": "kvcake.engine.emulated",
    "EngineBackend": "kvcake.engine.backend",
    "DecodeSeq": "kvcake.engine.backend",
    "BlockManager": "kvcake.engine.block_manager",
    "KVCacheFull": "kvcake.engine.block_manager",
    "KVLayout": "kvcake.engine.kv_memory",
    "KVMemory": "kvcake.engine.kv_memory",
    "EngineConfig": "kvcake.engine.config",
    "EmulatedConfig": "kvcake.engine.config",
    "SamplingParams": "kvcake.core.api",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'kvcake.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)
