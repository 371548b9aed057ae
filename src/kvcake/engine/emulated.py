"""``EmulatedBackend``: the engine API without weights, for trace-scale runs.

Prefill and decode take the cost model's time x ``time_scale`` (sleeping), and write real KV
bytes of ``kv_bytes_per_token x kv_scale`` per token. The bytes are a deterministic function of
(token id, position, layer, K/V) — see :func:`kv_pattern` — so a receiver can check with
:meth:`EmulatedBackend.verify_kv` that KV moved by the Transfer Engine arrived intact. Output
tokens are dummy ids (never EOS), so requests run to ``max_tokens``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from kvcake.core.api import SamplingParams
from kvcake.core.costmodel import CostModel, load_calibration, preset
from kvcake.core.ids import InstanceId
from kvcake.engine.backend import DecodeSeq, EngineBackend, LayerCallback
from kvcake.engine.block_manager import BlockManager
from kvcake.engine.config import EmulatedConfig
from kvcake.engine.kv_memory import KVLayout, KVMemory

FIRST_DUMMY_TOKEN = 100  # below: special ids (EOS...) the emulator never emits


def emulated_layout(cfg: EmulatedConfig, cm: CostModel) -> KVLayout:
    layers = cfg.layers or cm.model.layers
    per_layer_kv = cm.model.kv_bytes_per_token * cfg.kv_scale / (2 * layers)
    return KVLayout(
        num_blocks=cfg.num_kv_blocks,
        num_layers=layers,
        block_tokens=cfg.kv_block_tokens,
        kv_heads=1,
        head_dim=max(1, round(per_layer_kv)),
        dtype="uint8",
    )


def kv_pattern(tokens: np.ndarray, positions: np.ndarray, layer: int) -> np.ndarray:
    """``uint8[n, 2]``: the byte every element of a token's K (col 0) / V (col 1) holds."""
    base = tokens.astype(np.int64) * 31 + positions.astype(np.int64) * 7 + layer * 3
    return (np.stack([base, base + 1], axis=1) & 0xFF).astype(np.uint8)


class EmulatedBackend(EngineBackend):
    def __init__(
        self,
        cfg: EmulatedConfig | None = None,
        *,
        buffer: object | None = None,
        instance_id: InstanceId = InstanceId("emulated"),
    ) -> None:
        self.cfg = cfg or EmulatedConfig()
        cm = (
            load_calibration(self.cfg.calibration)
            if self.cfg.calibration
            else preset(self.cfg.preset)
        )
        self.cost_model = cm
        self.model_name = cm.model.name
        self.eos_token_id = 2
        layout = emulated_layout(self.cfg, cm)
        self.memory = KVMemory(layout, buffer=buffer, shm_name=self.cfg.kv_shm_name or None)
        self.blocks = BlockManager(layout.num_blocks, instance_id)
        self._arr = self.memory.blocks_array()

    def _write(
        self, tokens: Sequence[int], positions: np.ndarray, blk: np.ndarray, layer: int | None
    ) -> None:
        """Write the pattern of ``tokens`` at ``positions`` (in blocks ``blk``) for one layer,
        or for all layers at once (``layer=None``)."""
        if not len(tokens):
            return
        slot = positions % self.block_tokens
        layers = np.arange(self.num_layers) if layer is None else np.array([layer])
        base = np.asarray(tokens, dtype=np.int64) * 31 + positions.astype(np.int64) * 7
        pat = base[:, None] + layers[None, :] * 3  # [n, layers]
        for kv in (0, 1):
            val = ((pat + kv) & 0xFF).astype(np.uint8)[:, :, None]
            self._arr[blk[:, None], layers[None, :], kv, slot[:, None], :] = val

    def _write_range(self, new: Sequence[int], start: int, table: Sequence[int]) -> None:
        """Write tokens ``new`` at positions ``start...``: a partial first block token by token,
        the rest whole blocks at a time (never touching positions before ``start``)."""
        bt, end = self.block_tokens, start + len(new)
        head_end = min(end, -(-start // bt) * bt)
        if head_end > start:
            pos = np.arange(start, head_end)
            blk = np.asarray(table, dtype=np.int64)[pos // bt]
            self._write(new[: head_end - start], pos, blk, None)
        if end <= head_end:
            return
        nb = -(-(end - head_end) // bt)
        toks = np.zeros(nb * bt, dtype=np.int64)
        toks[: end - head_end] = np.asarray(new[head_end - start :], dtype=np.int64)
        base = (toks * 31 + np.arange(head_end, head_end + nb * bt) * 7).reshape(nb, 1, 1, bt)
        extra = np.arange(self.num_layers)[:, None] * 3 + np.arange(2)[None, :]
        pat = ((base + extra[None, :, :, None]) & 0xFF).astype(np.uint8)
        first = head_end // bt
        self._arr[np.asarray(table[first : first + nb], dtype=np.int64)] = pat[..., None]

    def prefill(
        self,
        tokens: Sequence[int],
        block_table: Sequence[int],
        num_cached_tokens: int,
        sampling: SamplingParams,
        on_layer_done: LayerCallback | None = None,
    ) -> int:
        self.check_table(block_table, len(tokens))
        total = self.cost_model.prefill_time(len(tokens), num_cached_tokens) * self.cfg.time_scale
        per_layer = total / self.num_layers
        t0 = time.perf_counter()
        # All layers written up front (cheap next to the emulated time), then each layer's
        # callback at its deadline, as a GPU would finish layer after layer.
        self._write_range(tokens[num_cached_tokens:], num_cached_tokens, block_table)
        for layer in range(self.num_layers):
            delay = t0 + per_layer * (layer + 1) - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            if on_layer_done is not None:
                on_layer_done(layer)
        return self.dummy_token(len(tokens))

    def decode(self, seqs: Sequence[DecodeSeq]) -> list[int]:
        if not seqs:
            return []
        ctx = sum(s.context_len for s in seqs)
        t0 = time.perf_counter()
        for s in seqs:
            self.check_table(s.block_table, s.num_computed + 1)
        pos = np.array([s.num_computed for s in seqs], dtype=np.int64)
        blk = np.array(
            [s.block_table[p // self.block_tokens] for s, p in zip(seqs, pos, strict=True)]
        )
        self._write([s.last_token for s in seqs], pos, blk, None)
        out = []
        for s in seqs:
            s.num_computed += 1
            s.last_token = self.dummy_token(s.num_computed)
            out.append(s.last_token)
        delay = t0 + self.cost_model.decode_step_time(len(seqs), ctx) * self.cfg.time_scale
        delay -= time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        return out

    def dummy_token(self, position: int) -> int:
        span = self.cfg.vocab_size - FIRST_DUMMY_TOKEN
        return FIRST_DUMMY_TOKEN + (position * 7919) % span

    def verify_kv(self, tokens: Sequence[int], block_table: Sequence[int], start: int = 0) -> bool:
        """True if positions ``start..len(tokens)-1`` hold the pattern prefill would write."""
        pos = np.arange(start, len(tokens))
        if pos.size == 0:
            return True
        blk = np.asarray(block_table, dtype=np.int64)[pos // self.block_tokens]
        slot = pos % self.block_tokens
        toks = np.asarray(tokens[start:], dtype=np.int64)
        for layer in range(self.num_layers):
            pat = kv_pattern(toks, pos, layer)
            got = self._arr[blk, layer, :, slot, :]  # [n, 2, width]
            if not (got == pat[:, :, None]).all():
                return False
        return True
