"""Llama forward (RMSNorm, RoPE, grouped-query attention, SwiGLU) over the paged KV cache.

The arithmetic follows transformers' ``LlamaForCausalLM`` op for op (same RoPE table formula,
RMSNorm in fp32, rotate-half RoPE, SDPA attention), so fp32 results agree to rounding.
The KV cache is the engine's region viewed as ``float32[num_blocks, layers, 2, block_tokens,
kv_heads * head_dim]``; K is stored after RoPE.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from kvcake.core.errors import EngineError
from kvcake.engine.model.weights import ModelConfig

PACKED_MAX_ROWS = 64


def can_pack() -> bool:
    """oneDNN (mkldnn) weight prepacking is available in this torch build."""
    return torch.backends.mkldnn.is_available() and hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    )


def pack(w: torch.Tensor) -> torch.Tensor:
    """An fp32 ``[out, in]`` weight reordered once into oneDNN's blocked layout (same values;
    hint: 8 rows per call)."""
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 8)


def packed_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    return (x * torch.rsqrt(variance + eps)).mul_(weight)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Layer:
    __slots__ = (
        "down",
        "down_p",
        "gate",
        "gate_up_p",
        "k",
        "norm_attn",
        "norm_mlp",
        "o",
        "q",
        "up",
        "v",
    )

    def __init__(self, w: dict[str, torch.Tensor], i: int) -> None:
        p = f"model.layers.{i}."
        self.norm_attn = w[p + "input_layernorm.weight"]
        self.norm_mlp = w[p + "post_attention_layernorm.weight"]
        self.q = w[p + "self_attn.q_proj.weight"]
        self.k = w[p + "self_attn.k_proj.weight"]
        self.v = w[p + "self_attn.v_proj.weight"]
        self.o = w[p + "self_attn.o_proj.weight"]
        self.gate = w[p + "mlp.gate_proj.weight"]
        self.up = w[p + "mlp.up_proj.weight"]
        self.down = w[p + "mlp.down_proj.weight"]
        self.gate_up_p: torch.Tensor | None = None  # see PagedLlama.__init__
        self.down_p: torch.Tensor | None = None


class PagedLlama:
    """Stateless apart from weights: every call names the blocks it reads and writes."""

    def __init__(
        self,
        cfg: ModelConfig,
        weights: dict[str, Any],
        kv: torch.Tensor,
        packed: bool | None = None,
    ) -> None:
        self.packed = can_pack() if packed is None else packed
        try:
            self.layers = [Layer(weights, i) for i in range(cfg.layers)]
            self.embed = weights["model.embed_tokens.weight"]
            self.norm = weights["model.norm.weight"]
            self.lm_head = self.embed if cfg.tie_embeddings else weights["lm_head.weight"]
        except KeyError as exc:
            raise EngineError(f"checkpoint is missing tensor {exc}") from exc
        # For decode batches (2..PACKED_MAX_ROWS rows): gate and up fused into one
        # [2 * intermediate, hidden] matrix, down and the LM head, each reordered once into
        # oneDNN's blocked layout (anonymous memory: 212 + 106 + 113 MB for SmolLM2-135M).
        self.lm_head_p = pack(self.lm_head) if self.packed else None
        if self.packed:
            buf = torch.empty(2 * cfg.intermediate, cfg.hidden)  # one staging copy, reused
            for layer in self.layers:
                layer.gate_up_p = pack(torch.cat((layer.gate, layer.up), out=buf))
                layer.down_p = pack(layer.down)
        self.cfg = cfg
        self.kv = kv
        self.block_tokens = kv.shape[3]
        dim = cfg.head_dim
        inv_freq = 1.0 / (
            cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
        )
        pos = torch.arange(cfg.max_positions, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()

    # --- pieces ----------------------------------------------------------------------------
    @staticmethod
    def _small(x: torch.Tensor) -> bool:
        """Rows for which the packed copies beat ``F.linear`` on the mapped weights (a decode
        batch); one row (a GEMV, already at memory bandwidth) and prefill use the originals."""
        return 1 < x.shape[0] <= PACKED_MAX_ROWS

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return (x * cos).add_(rotate_half(x).mul_(sin))

    def _rope_at(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin rows of ``pos`` as ``[N, 1, hd]`` (looked up once per forward)."""
        return self.cos[pos][:, None, :], self.sin[pos][:, None, :]

    def _qkv(
        self, layer: Layer, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x ``[N, hidden]`` → q ``[N, heads, hd]``, k/v ``[N, kv_heads, hd]`` (RoPE applied)."""
        c = self.cfg
        h = rms_norm(x, layer.norm_attn, c.rms_eps)
        q = F.linear(h, layer.q).view(-1, c.heads, c.head_dim)
        k = F.linear(h, layer.k).view(-1, c.kv_heads, c.head_dim)
        v = F.linear(h, layer.v).view(-1, c.kv_heads, c.head_dim)
        cos, sin = rope
        return self._rope(q, cos, sin), self._rope(k, cos, sin), v

    def _finish(self, layer: Layer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, SwiGLU MLP, residual."""
        x = F.linear(attn, layer.o).add_(x)
        h = rms_norm(x, layer.norm_mlp, self.cfg.rms_eps)
        if layer.gate_up_p is not None and layer.down_p is not None and self._small(h):
            gu = packed_linear(h, layer.gate_up_p)
            n = self.cfg.intermediate
            return x + packed_linear(F.silu(gu[:, :n]) * gu[:, n:], layer.down_p)
        # In place: no fresh [N, intermediate] temporaries (same ops, same rounding).
        a = F.silu(F.linear(h, layer.gate), inplace=True).mul_(F.linear(h, layer.up))
        return F.linear(a, layer.down).add_(x)

    def _store(
        self, li: int, k: torch.Tensor, v: torch.Tensor, blk: torch.Tensor, slot: torch.Tensor
    ) -> None:
        n = k.shape[0]
        self.kv[blk, li, 0, slot] = k.reshape(n, -1)
        self.kv[blk, li, 1, slot] = v.reshape(n, -1)

    def _gather(
        self, li: int, table: torch.Tensor, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of the blocks in ``table`` ``[B, nb]`` → ``[B, kv_heads, nb * bt, hd]`` each.
        One copy per tensor: K and V of a layer-block are each contiguous ``[bt, W]`` runs.
        ``out`` (``[2, B * nb, bt, W]``, reused for every layer of a step) saves allocating and
        page-faulting fresh buffers per layer."""
        c = self.cfg
        b, nb = table.shape
        flat = table.reshape(-1)
        if out is None:
            out = self.kv.new_empty((2, flat.shape[0], self.block_tokens, self.kv.shape[-1]))
        torch.index_select(self.kv[:, li, 0], 0, flat, out=out[0])
        torch.index_select(self.kv[:, li, 1], 0, flat, out=out[1])
        shape = (b, nb * self.block_tokens, c.kv_heads, c.head_dim)
        return out[0].view(shape).transpose(1, 2), out[1].view(shape).transpose(1, 2)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        h = rms_norm(x, self.norm, self.cfg.rms_eps)
        if self.lm_head_p is not None and self._small(h):
            return packed_linear(h, self.lm_head_p)
        return F.linear(h, self.lm_head)

    # --- prefill ---------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill_chunk(
        self,
        tokens: torch.Tensor,
        start: int,
        table: torch.Tensor,
        on_layer_done: Callable[[int], None] | None = None,
        all_logits: bool = False,
        write: bool = True,
    ) -> torch.Tensor:
        """Run positions ``start .. start+len(tokens)-1`` of one sequence whose earlier KV is in
        ``table`` (``int64[nb]``); write their KV; return logits of the last position (or of all
        positions with ``all_logits``). ``write=False`` reads the chunk's own KV from the cache
        instead (it is already there: a fully cached prompt, possibly in shared blocks)."""
        c = self.cfg
        n = tokens.shape[0]
        end = start + n
        pos = torch.arange(start, end)
        blk, slot = table[pos // self.block_tokens], pos % self.block_tokens
        nb = -(-end // self.block_tokens)
        mask = None
        if start:
            kpos = torch.arange(end)
            mask = kpos[None, :] <= pos[:, None]  # [n, end]
        x = self.embed[tokens]
        rope = self._rope_at(pos)
        buf = self.kv.new_empty((2, nb, self.block_tokens, self.kv.shape[-1])) if start else None
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, rope)
            if write:
                self._store(li, k, v, blk, slot)
            if start:
                kk, vv = self._gather(li, table[None, :nb], buf)
                kk, vv = kk[:, :, :end], vv[:, :, :end]
            else:
                kk, vv = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None],
                kk,
                vv,
                attn_mask=mask,
                is_causal=not start and n > 1,
                enable_gqa=True,
            )
            x = self._finish(layer, x, o[0].transpose(0, 1).reshape(n, c.heads * c.head_dim))
            if on_layer_done is not None:
                on_layer_done(li)
        return self.logits(x if all_logits else x[-1:])

    # --- decode ----------------------------------------------------------------------------
    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, pos: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
        """One token per sequence: ``tokens``/``pos`` ``int64[B]``, ``tables`` ``int64[B, nb]``
        (padded with any valid block id). Returns logits ``[B, vocab]``."""
        c = self.cfg
        b = tokens.shape[0]
        rep = c.heads // c.kv_heads
        blk = tables.gather(1, (pos // self.block_tokens)[:, None])[:, 0]
        slot = pos % self.block_tokens
        span = int(pos.max()) + 1
        mask = None
        if b > 1:
            mask = (torch.arange(span)[None, :] <= pos[:, None])[:, None, None, :]
        x = self.embed[tokens]
        rope = self._rope_at(pos)
        buf = self.kv.new_empty((2, tables.numel(), self.block_tokens, self.kv.shape[-1]))
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, rope)
            self._store(li, k, v, blk, slot)
            kk, vv = self._gather(li, tables, buf)
            # One query per sequence: fold the GQA group into the query axis (no K/V repeat).
            qq = q.view(b, c.kv_heads, rep, c.head_dim)
            o = F.scaled_dot_product_attention(qq, kk[:, :, :span], vv[:, :, :span], attn_mask=mask)
            x = self._finish(layer, x, o.reshape(b, c.heads * c.head_dim))
        return self.logits(x)
