"""The low-level engine API a server builds on (docs/engine.md "Backend API").

A backend owns a :class:`~kvcake.engine.kv_memory.KVMemory` region and a
:class:`~kvcake.engine.block_manager.BlockManager`. Callers allocate blocks, build per-request
block tables, and call :meth:`EngineBackend.prefill` / :meth:`EngineBackend.decode`; the backend
writes KV only into the blocks it is given. Not thread-safe: one engine loop calls it.

Position ``i`` of a request lives in block ``block_table[i // block_tokens]``, slot
``i % block_tokens``. KV of positions ``< num_cached_tokens`` must already be in the blocks
(reused locally, or written from outside) — the backend trusts it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvcake.core.api import KVEvent, SamplingParams
from kvcake.core.costmodel import CostModel
from kvcake.core.errors import EngineError
from kvcake.core.hashing import block_hashes
from kvcake.core.ids import BlockHash, RequestId
from kvcake.engine.block_manager import BlockManager
from kvcake.engine.kv_memory import KVLayout, KVMemory

LayerCallback = Callable[[int], None]


@dataclass
class DecodeSeq:
    """A running sequence. ``num_computed`` tokens have KV in ``block_table``; ``last_token`` is
    the newest token (sampled, KV not yet written). :meth:`EngineBackend.decode` writes its KV at
    position ``num_computed``, increments ``num_computed`` and sets ``last_token`` to the next
    token (also returned)."""

    request_id: RequestId
    block_table: list[int]
    num_computed: int
    last_token: int
    sampling: SamplingParams = field(default_factory=SamplingParams)

    @property
    def context_len(self) -> int:
        return self.num_computed + 1


class EngineBackend(ABC):
    """Torch (real weights) and emulated (cost-model sleeps) backends share this API."""

    memory: KVMemory
    blocks: BlockManager
    cost_model: CostModel
    eos_token_id: int | None = None
    model_name: str = ""

    @property
    def layout(self) -> KVLayout:
        return self.memory.layout

    @property
    def block_tokens(self) -> int:
        return self.layout.block_tokens

    @property
    def num_layers(self) -> int:
        return self.layout.num_layers

    # --- compute ---------------------------------------------------------------------------
    @abstractmethod
    def prefill(
        self,
        tokens: Sequence[int],
        block_table: Sequence[int],
        num_cached_tokens: int,
        sampling: SamplingParams,
        on_layer_done: LayerCallback | None = None,
    ) -> int:
        """Compute KV of ``tokens[num_cached_tokens:]`` into ``block_table`` and return the first
        sampled token. ``on_layer_done(l)`` runs right after layer ``l``'s KV of the whole prompt
        is written (with chunking: during the last chunk), so layer ``l`` of every block may be
        streamed out from then on."""

    @abstractmethod
    def decode(self, seqs: Sequence[DecodeSeq]) -> list[int]:
        """One decode iteration over a batch: writes each ``last_token``'s KV, advances
        ``num_computed``, sets ``last_token`` and returns one new token per sequence. Every sequence needs a slot for
        position ``num_computed`` (see :meth:`ensure_capacity`)."""

    # --- blocks ----------------------------------------------------------------------------
    def block_hashes(self, tokens: Sequence[int]) -> list[BlockHash]:
        return block_hashes(tokens, self.block_tokens)

    def blocks_needed(self, num_tokens: int) -> int:
        return self.layout.blocks_for(num_tokens)

    def allocate_blocks(self, n: int) -> list[int]:
        return self.blocks.allocate(n)

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        self.blocks.free(block_ids)

    def lookup_prefix(self, hashes: Sequence[BlockHash]) -> list[int]:
        """Cached blocks for the longest prefix of ``hashes`` (references taken; free them)."""
        return self.blocks.lookup_prefix(hashes)

    def register_blocks(self, block_ids: Sequence[int], hashes: Sequence[BlockHash]) -> int:
        """Name complete blocks (computed here or written from outside) for reuse."""
        return self.blocks.register(block_ids, hashes)

    def kv_events(self, since_seq: int) -> list[KVEvent]:
        return self.blocks.events(since_seq)

    def export_blocks(self, block_ids: Sequence[int]) -> bytes:
        return self.memory.export_blocks(block_ids)

    def import_blocks(self, block_ids: Sequence[int], data: bytes | memoryview) -> None:
        self.memory.import_blocks(block_ids, data)

    def ensure_capacity(self, block_table: list[int], num_tokens: int) -> None:
        """Append newly allocated blocks to ``block_table`` until it holds ``num_tokens``."""
        need = self.blocks_needed(num_tokens) - len(block_table)
        if need > 0:
            block_table.extend(self.blocks.allocate(need))

    def check_table(self, block_table: Sequence[int], num_tokens: int) -> None:
        if len(block_table) < self.blocks_needed(num_tokens):
            raise EngineError(
                f"block table of {len(block_table)} blocks cannot hold {num_tokens} tokens "
                f"({self.block_tokens} per block)"
            )
        for b in block_table:
            self.layout.check_block(b)

    def close(self) -> None:
        self.memory.close()
