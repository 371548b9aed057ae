"""Block identity for vLLM engines: kvcake's chained hash over token ids, never vLLM's own hash.

A block's key is ``core.hashing.block_key(model, dtype, block_tokens, hash)``, so two engines
serving the same model with the same dtype and block size name equal prefixes equally, whatever
their ``PYTHONHASHSEED`` or vLLM version. A tenant salt changes the chain's root.

With tensor parallelism each rank holds its own KV heads, so a block is ``tp_size`` pool
objects, one per rank: ``core.hashing.rank_key(block key, rank, tp_size)`` (``.../tp1of2``).
The scheduler plans with block keys and counts a block pooled only when every rank's object
exists; each worker loads and saves its own rank's object. Events and the proxy's index name a
block once, by its hash (``core.hashing.parse_block_key``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvcake.core.hashing import block_hashes, block_key, parse_block_key, rank_key, salted_root
from kvcake.core.ids import BlockHash
from kvcake.store.protocol import BlockMeta


def tenant_root(tenant: str) -> BlockHash:
    """Root of the hash chain: kvcake's ROOT_HASH, or one derived from the tenant name (the
    same as ``core.hashing.salted_root``, so the proxy's salted keys equal the connector's)."""
    return salted_root(tenant)


@dataclass(frozen=True)
class BlockNamer:
    model: str
    dtype: str
    block_tokens: int
    tenant: str = ""
    tp_size: int = 1

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")

    def keys(self, tokens: Sequence[int]) -> list[str]:
        """Block keys (rank-free) of every full block of ``tokens`` (a trailing partial block
        has none): what the scheduler plans with."""
        root = tenant_root(self.tenant)
        return [
            block_key(self.model, self.dtype, self.block_tokens, h)
            for h in block_hashes(tokens, self.block_tokens, root)
        ]

    def for_rank(self, key: str, rank: int) -> str:
        """The pool object holding ``rank``'s share of block ``key``."""
        return rank_key(key, rank, self.tp_size)

    def all_ranks(self, key: str) -> list[str]:
        """Every rank's object of block ``key``: the block is pooled only if all exist."""
        return [self.for_rank(key, r) for r in range(self.tp_size)]

    def objects(self, tokens: Sequence[int]) -> list[str]:
        """Every pool object of every full block of ``tokens`` (all ranks, block by block)."""
        return [o for k in self.keys(tokens) for o in self.all_ranks(k)]


def lineage(
    keys: Sequence[str], tokens: Sequence[int], start: int, stop: int, block: int
) -> list[BlockMeta]:
    """Blocks ``keys[start:stop]`` of a prompt (``keys``: all its block keys) with their parent
    hash (None for the first block) and token ids: what routers' KV events need
    (``integrations/vllm/events.py``, ``store/vllm_events.py``)."""
    out = []
    for i in range(start, min(stop, len(keys), len(tokens) // block)):
        here = parse_block_key(keys[i])
        before = parse_block_key(keys[i - 1]) if i else None
        if here is None:
            break
        parent = int(before[0]) if before is not None else None
        out.append(BlockMeta(int(here[0]), parent, list(tokens[i * block : (i + 1) * block])))
    return out
