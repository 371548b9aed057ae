"""Resolve a model name to a checkpoint directory and memory-map its weights.

Weights are mapped copy-on-write straight from the ``.safetensors`` files (``numpy.memmap``
mode ``"c"``), so every process running the same model shares the page-cache copy and a
load takes well under a second after the first conversion.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvcake.core.errors import EngineError
from kvcake.engine.model.convert import cached_checkpoint, packaged_gguf

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64}


@dataclass(frozen=True)
class ModelConfig:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rms_eps: float
    rope_theta: float
    max_positions: int
    tie_embeddings: bool
    eos_token_id: int | None
    name: str = "model"

    @classmethod
    def from_dir(cls, ckpt: Path) -> ModelConfig:
        path = ckpt / "config.json"
        try:
            c = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise EngineError(f"{ckpt} is not a checkpoint directory (no config.json)") from exc
        except ValueError as exc:
            raise EngineError(f"{path} is not valid JSON: {exc}") from exc
        if c.get("model_type") not in ("llama", None):
            raise EngineError(f"{ckpt}: only Llama-architecture models are supported")
        if (c.get("rope_scaling") or {}).get("rope_type", "default") not in ("default", None):
            raise EngineError(f"{ckpt}: rope scaling is not supported")
        try:
            heads = int(c["num_attention_heads"])
            theta = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta")
            eos = c.get("eos_token_id")
            return cls(
                hidden=int(c["hidden_size"]),
                intermediate=int(c["intermediate_size"]),
                layers=int(c["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(c.get("num_key_value_heads", heads)),
                head_dim=int(c.get("head_dim") or c["hidden_size"] // heads),
                vocab=int(c["vocab_size"]),
                rms_eps=float(c.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta or 10000.0),
                max_positions=int(c.get("max_position_embeddings", 2048)),
                tie_embeddings=bool(c.get("tie_word_embeddings", False)),
                eos_token_id=int(eos[0] if isinstance(eos, list) else eos)
                if eos is not None
                else None,
                name=ckpt.name,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineError(f"{path}: missing or bad field {exc}") from exc


def resolve_checkpoint(model: str, cache_root: Path) -> Path:
    """``"smollm2"`` → the packaged GGUF (converted); ``*.gguf`` → converted; a directory → as is."""
    if model == "smollm2":
        return cached_checkpoint(packaged_gguf(), cache_root)
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        return cached_checkpoint(path, cache_root)
    if path.is_dir():
        return path
    raise EngineError(
        f"model {model!r} is neither 'smollm2', a .gguf file nor a checkpoint directory"
    )


def _map_file(path: Path) -> dict[str, np.ndarray]:
    with path.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header: dict[str, Any] = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    raw = np.memmap(path, dtype=np.uint8, mode="c")
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise EngineError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        out[name] = raw[8 + n + start : 8 + n + end].view(dtype).reshape(info["shape"])
    return out


def map_weights(ckpt: Path) -> dict[str, Any]:
    """All tensors of the checkpoint as float32 torch tensors (mmap-backed where already fp32)."""
    # lazy: optional dependency (torch)
    import torch

    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise EngineError(f"{ckpt} has no .safetensors files")
    out: dict[str, Any] = {}
    for f in files:
        for name, arr in _map_file(f).items():
            if arr.dtype == np.uint16:  # bfloat16 bits
                t = torch.from_numpy(np.asarray(arr)).view(torch.bfloat16).float()
            else:
                t = torch.from_numpy(arr)
                if t.dtype != torch.float32:
                    t = t.float()
            out[name] = t
    return out
