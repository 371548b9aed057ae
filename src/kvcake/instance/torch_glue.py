"""Building the real-model backend of an instance with its KV memory in a Transfer Engine
segment (so peers write prefill KV straight into it)."""

from __future__ import annotations

from typing import Any

from kvcake.core.api import segment_of
from kvcake.core.config import KVLayoutConfig
from kvcake.core.ids import InstanceId
from kvcake.engine.config import EngineConfig, cache_root
from kvcake.engine.kv_memory import KVLayout
from kvcake.engine.model.weights import ModelConfig, resolve_checkpoint
from kvcake.serve.config import InstanceConfig


def torch_backend(cfg: InstanceConfig, kv: KVLayoutConfig, iid: InstanceId, te: Any) -> Any:
    # lazy: optional dependency (torch: engine.torch_backend imports it)
    from kvcake.engine.torch_backend import TorchBackend

    ecfg = EngineConfig(
        kv=kv, num_kv_blocks=cfg.kv_blocks, threads=cfg.threads, max_batch=cfg.max_batch,
        prefill_chunk=cfg.prefill_chunk,
    )  # fmt: skip
    buf = None
    if te is not None:
        mc = ModelConfig.from_dir(resolve_checkpoint(ecfg.model, cache_root(ecfg.cache_dir)))
        layout = KVLayout(cfg.kv_blocks, mc.layers, kv.kv_block_tokens, mc.kv_heads, mc.head_dim)
        buf = te.allocate_segment(segment_of(iid), layout.total_bytes)
    be = TorchBackend(ecfg, buffer=buf, instance_id=iid, calibration=cfg.calibration or None)
    be.vocab_size = be.model_config.vocab  # type: ignore[attr-defined]
    be.max_context = be.model_config.max_positions  # type: ignore[attr-defined]
    return be
