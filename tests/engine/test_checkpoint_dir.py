"""A local Llama-architecture checkpoint directory (config.json, *.safetensors, tokenizer) loads
as a model and answers as the packaged GGUF does."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from kvcake.core.errors import EngineError
from kvcake.engine.config import EngineConfig
from kvcake.engine.model.weights import resolve_checkpoint
from kvcake.engine.torch_backend import TorchBackend

from .helpers import run


def test_checkpoint_directory_loads_and_matches(backend: Any, tmp_path: Path) -> None:
    ckpt = tmp_path / "my-llama"
    shutil.copytree(backend.checkpoint, ckpt)  # a plain HF-style directory, outside the cache
    assert resolve_checkpoint(str(ckpt), tmp_path / "cache") == ckpt
    other = TorchBackend(EngineConfig(model=str(ckpt), num_kv_blocks=16, threads=1))
    try:
        prompt = backend.tokenizer.encode("The capital of France is")
        assert other.tokenizer.encode("The capital of France is") == prompt
        assert run(other, [prompt])[0].output == run(backend, [prompt])[0].output
    finally:
        other.close()


def test_not_a_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="neither 'smollm2'"):
        resolve_checkpoint(str(tmp_path / "missing"), tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EngineError):
        TorchBackend(EngineConfig(model=str(empty), num_kv_blocks=4, threads=1))
