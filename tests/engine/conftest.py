"""Engine test fixtures: the model is converted once (cached under $KVCAKE_CACHE_DIR or
~/.cache/kvcake) and loaded once per session; every engine shares its memory-mapped weights."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "List three colours of the rainbow:",
]


@pytest.fixture(scope="session")
def torch_threads() -> int:
    import torch

    torch.manual_seed(0)
    return 1


@pytest.fixture(scope="session")
def backend(torch_threads: int) -> Iterator[Any]:
    from kvcake.engine.config import EngineConfig
    from kvcake.engine.torch_backend import TorchBackend

    be = TorchBackend(EngineConfig(num_kv_blocks=192, threads=torch_threads, prefill_chunk=512))
    yield be
    be.close()


@pytest.fixture
def fresh(backend: Any) -> Iterator[Any]:
    """The session backend, checked to leak no blocks across a test."""
    used = backend.blocks.num_used
    yield backend
    backend.blocks.check()
    assert backend.blocks.num_used == used, "test leaked KV blocks"


@pytest.fixture(scope="session")
def hf_model(backend: Any) -> Any:
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(
        str(backend.checkpoint), dtype=torch.float32, attn_implementation="sdpa"
    )
    return model.eval()


@pytest.fixture(scope="session")
def long_prompt(backend: Any) -> list[int]:
    """A >= 1,500-token natural-text prompt (deterministic)."""
    para = (
        "The history of the city goes back many centuries. Merchants came from distant lands "
        "to trade spices, cloth and metal tools, and the markets grew along the river. "
        "Scholars wrote about the bridges, the libraries and the gardens of the old town. "
    )
    text = "".join(f"Chapter {i}. {para}" for i in range(60)) + "In summary, the city"
    ids: list[int] = backend.tokenizer.encode(text)
    assert len(ids) >= 1500
    return ids[-1536:]
