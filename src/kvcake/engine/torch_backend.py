"""``TorchBackend``: the engine API over a real Llama checkpoint on the CPU."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from kvcake.core.api import SamplingParams
from kvcake.core.costmodel import load_calibration, preset
from kvcake.core.errors import EngineError
from kvcake.core.ids import InstanceId
from kvcake.engine.backend import DecodeSeq, EngineBackend, LayerCallback
from kvcake.engine.block_manager import BlockManager
from kvcake.engine.config import EngineConfig, cache_root
from kvcake.engine.kv_memory import KVLayout, KVMemory
from kvcake.engine.model.llama import PagedLlama, can_pack
from kvcake.engine.model.tokenizer import TextTokenizer
from kvcake.engine.model.weights import ModelConfig, map_weights, resolve_checkpoint
from kvcake.engine.sampling import sample


class TorchBackend(EngineBackend):
    """Owns the weights (memory-mapped), the tokenizer and a KV region (its own, or ``buffer``)."""

    def __init__(
        self,
        cfg: EngineConfig | None = None,
        *,
        buffer: object | None = None,
        instance_id: InstanceId = InstanceId("torch"),
        calibration: str | Path | None = None,
    ) -> None:
        self.cfg = cfg = cfg or EngineConfig()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.checkpoint = resolve_checkpoint(cfg.model, cache_root(cfg.cache_dir))
        self.model_config = mc = ModelConfig.from_dir(self.checkpoint)
        self.tokenizer = TextTokenizer(self.checkpoint)
        self.eos_token_id = self.tokenizer.eos_token_id or mc.eos_token_id
        self.model_name = cfg.kv.model
        layout = KVLayout(
            cfg.num_kv_blocks, mc.layers, cfg.kv.kv_block_tokens, mc.kv_heads, mc.head_dim
        )
        self.memory = KVMemory(layout, buffer=buffer, shm_name=cfg.kv_shm_name or None)
        kv = torch.from_numpy(self.memory.bytes.view(np.float32)).view(
            layout.num_blocks, layout.num_layers, 2, layout.block_tokens, layout.width
        )
        self.model = PagedLlama(
            mc, map_weights(self.checkpoint), kv, packed=cfg.packed_weights and can_pack()
        )
        self.blocks = BlockManager(layout.num_blocks, instance_id)
        self.cost_model = (
            load_calibration(calibration) if calibration else preset("smollm2-135m/cpu")
        )

    def _check_ids(self, toks: torch.Tensor) -> None:
        if int(toks.min()) < 0 or int(toks.max()) >= self.model_config.vocab:
            raise EngineError(f"token ids must be in [0, {self.model_config.vocab})")

    # --- prefill ---------------------------------------------------------------------------
    def prefill_logits(
        self,
        tokens: Sequence[int],
        block_table: Sequence[int],
        num_cached_tokens: int,
        on_layer_done: LayerCallback | None = None,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """Chunked prefill; logits of the last position (``[1, vocab]``), or with
        ``all_logits`` of every computed position."""
        n = len(tokens)
        if n == 0:
            raise EngineError("prompt is empty")
        if n > self.model_config.max_positions:
            raise EngineError(
                f"prompt of {n} tokens exceeds the model context "
                f"({self.model_config.max_positions})"
            )
        if not 0 <= num_cached_tokens <= n:
            raise EngineError(f"num_cached_tokens {num_cached_tokens} outside [0, {n}]")
        self.check_table(block_table, n)
        # A fully cached prompt still needs the last position's logits: recompute that token,
        # reading (not rewriting) its KV, since the block may be shared.
        write = num_cached_tokens < n
        start = min(num_cached_tokens, n - 1)
        toks = torch.tensor(list(tokens), dtype=torch.int64)
        self._check_ids(toks)
        table = torch.tensor(list(block_table), dtype=torch.int64)
        chunk = self.cfg.prefill_chunk
        outs = []
        while start < n:
            end = min(n, start + chunk)
            last = end == n
            outs.append(
                self.model.prefill_chunk(
                    toks[start:end],
                    start,
                    table,
                    on_layer_done if last else None,
                    all_logits,
                    write,
                )
            )
            start = end
        return torch.cat(outs) if all_logits else outs[-1]

    def prefill(
        self,
        tokens: Sequence[int],
        block_table: Sequence[int],
        num_cached_tokens: int,
        sampling: SamplingParams,
        on_layer_done: LayerCallback | None = None,
    ) -> int:
        logits = self.prefill_logits(tokens, block_table, num_cached_tokens, on_layer_done)
        return sample(logits, [sampling], [len(tokens)])[0]

    # --- decode ----------------------------------------------------------------------------
    def decode_logits(self, seqs: Sequence[DecodeSeq]) -> torch.Tensor:
        """Write each ``last_token``'s KV, advance ``num_computed``; logits ``[B, vocab]``."""
        if not seqs:
            raise EngineError("decode needs at least one sequence")
        span = max(s.num_computed for s in seqs) + 1
        if span > self.model_config.max_positions:
            raise EngineError(f"context of {span} tokens exceeds the model context")
        nb = self.blocks_needed(span)
        rows = []
        for s in seqs:
            self.check_table(s.block_table, s.num_computed + 1)
            t = s.block_table[:nb]
            rows.append(t + [t[0]] * (nb - len(t)))  # pad with a valid id; masked out
        last = torch.tensor([s.last_token for s in seqs], dtype=torch.int64)
        self._check_ids(last)
        logits = self.model.decode(
            last,
            torch.tensor([s.num_computed for s in seqs], dtype=torch.int64),
            torch.tensor(rows, dtype=torch.int64),
        )
        for s in seqs:
            s.num_computed += 1
        return logits

    def decode(self, seqs: Sequence[DecodeSeq]) -> list[int]:
        if not seqs:
            return []
        logits = self.decode_logits(seqs)
        out = sample(logits, [s.sampling for s in seqs], [s.num_computed for s in seqs])
        for s, t in zip(seqs, out, strict=True):
            s.last_token = t
        return out
