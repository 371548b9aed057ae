"""Offline generation: ``LLM(model="smollm2").generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvcake.core.api import FinishReason, SamplingParams
from kvcake.core.config import KVLayoutConfig
from kvcake.core.errors import EngineError
from kvcake.core.ids import RequestId
from kvcake.engine.config import EngineConfig
from kvcake.engine.scheduler import Request, Scheduler

Prompt = str | Sequence[int] | Sequence[Mapping[str, str]]


@dataclass(frozen=True)
class RequestOutput:
    request_id: RequestId
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason
    cached_tokens: int
    ttft_s: float
    latency_s: float
    error: str | None = None


def _is_single(prompts: Any) -> bool:
    """A str, a token-id list, or one chat conversation (a list of message dicts)."""
    if isinstance(prompts, str):
        return True
    if isinstance(prompts, Sequence) and prompts:
        first = prompts[0]
        return isinstance(first, int | Mapping)
    return False


class LLM:
    """A :class:`~kvcake.engine.torch_backend.TorchBackend` plus a :class:`Scheduler`.

    ``model``: ``"smollm2"``, a ``.gguf`` path or a Llama checkpoint directory. Other keyword
    arguments are :class:`EngineConfig` fields (e.g. ``num_kv_blocks=64, threads=2``)."""

    def __init__(
        self, model: str = "smollm2", config: EngineConfig | None = None, **overrides: Any
    ) -> None:
        # lazy: optional dependency (torch: engine.torch_backend imports it)
        from kvcake.engine.torch_backend import TorchBackend

        if config is None:
            block = overrides.pop("kv_block_tokens", None)
            kv = KVLayoutConfig(kv_block_tokens=block) if block else KVLayoutConfig()
            config = EngineConfig(model=model, kv=kv, **overrides)
        self.config = config
        self.backend = TorchBackend(config)
        self.tokenizer = self.backend.tokenizer
        self.scheduler = Scheduler(
            self.backend, config.max_batch, config.prefill_chunk, config.prefix_caching
        )
        self._ids = itertools.count()

    def encode(self, prompt: Any) -> list[int]:
        """A string, a list of token ids, or a list of chat messages → prompt token ids."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        items: list[Any] = list(prompt) if isinstance(prompt, Sequence) else []
        if items and all(isinstance(m, Mapping) for m in items):
            return self.tokenizer.encode_chat([dict(m) for m in items])
        if items and all(isinstance(t, int) and not isinstance(t, bool) for t in items):
            if any(not 0 <= t < self.tokenizer.vocab_size for t in items):
                raise EngineError("token id outside the vocabulary")
            return [int(t) for t in items]
        raise EngineError("a prompt is a string, a list of token ids, or a list of chat messages")

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run all prompts as one continuous batch; outputs in input order."""
        batch: list[Any] = [prompts] if _is_single(prompts) else list(prompts)
        params = sampling if isinstance(sampling, Sequence) else [sampling or SamplingParams()]
        if len(params) == 1:
            params = list(params) * len(batch)
        if len(params) != len(batch):
            raise EngineError("give one SamplingParams, or one per prompt")
        reqs = [
            Request(RequestId(f"offline-{next(self._ids)}"), self.encode(p), sp)
            for p, sp in zip(batch, params, strict=True)
        ]
        for r in reqs:
            if not r.prompt:
                raise EngineError("prompt is empty")
            self.scheduler.add(r)
        while any(r.finish_reason is None for r in reqs):
            self.scheduler.step()
        self.scheduler.finished.clear()
        return [self._output(r) for r in reqs]

    def chat(
        self, messages: Sequence[Mapping[str, str]], sampling: SamplingParams | None = None
    ) -> RequestOutput:
        return self.generate([messages], sampling)[0]

    def _output(self, r: Request) -> RequestOutput:
        assert r.finish_reason is not None
        end = r.finish_time or r.arrival
        return RequestOutput(
            r.request_id,
            tuple(r.prompt),
            tuple(r.output),
            self.tokenizer.decode(r.output),
            r.finish_reason,
            r.cached_tokens,
            (r.first_token_time or end) - r.arrival,
            end - r.arrival,
            r.error,
        )

    def close(self) -> None:
        self.backend.close()
