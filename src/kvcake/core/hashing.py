"""Chained block hashes: the one function that names KV blocks everywhere.

A prompt is cut into full blocks of ``block_tokens`` tokens; block *i*'s hash covers its own
tokens *and* block *i-1*'s hash, so equal hashes mean equal prefixes (paper §3). The engine, the
store keys, the proxy, the conductor's index and the simulator all call :func:`block_hashes`.

The hash is BLAKE2b-64 over little-endian bytes, so it is stable across processes, machines and
runs (it never touches Python's randomised ``hash``).

A **salt** (a tenant, or a request's ``cache_salt`` as vLLM accepts it) changes the chain's root
(:func:`salted_root`), so equal prompts of different salts share no block hash and hence no
store key, no conductor index entry and no pooled block, with the key format unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np

from kvcake.core.ids import BlockHash, ObjectKey

#: Parent hash of the first block. Non-zero so an empty prefix never collides with a real block.
ROOT_HASH = BlockHash(0x6B7663616B650001)  # "kvcake" + 1
_MAX_TOKEN = 2**32 - 1
_HEX = frozenset("0123456789abcdef")


def hash_block(parent: BlockHash, tokens: Sequence[int] | np.ndarray) -> BlockHash:
    """Hash one block of token ids chained onto ``parent``."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"tokens must be one-dimensional, got shape {arr.shape}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > _MAX_TOKEN):
        raise ValueError("token ids must be in [0, 2**32)")
    h = hashlib.blake2b(digest_size=8)
    h.update(int(parent).to_bytes(8, "little"))
    h.update(arr.astype("<u4", copy=False).tobytes())
    return BlockHash(int.from_bytes(h.digest(), "little"))


def salted_root(salt: str) -> BlockHash:
    """Root of the hash chain for ``salt``: :data:`ROOT_HASH` for "" (no salt), else BLAKE2b-64
    of the salt (the vLLM connector's tenant roots are these)."""
    if not salt:
        return ROOT_HASH
    digest = hashlib.blake2b(b"kvcake-tenant\0" + salt.encode(), digest_size=8).digest()
    return BlockHash(int.from_bytes(digest, "little"))


def block_hashes(
    tokens: Sequence[int] | np.ndarray,
    block_tokens: int,
    parent: BlockHash | None = None,
    salt: str = "",
) -> list[BlockHash]:
    """Chained hashes of every *full* block of ``tokens``; a trailing partial block is not named
    (it cannot be shared until it is full). The chain starts at ``parent`` (a continuation) or
    at the root of ``salt``."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    if parent is None:
        parent = salted_root(salt)
    elif salt:
        raise ValueError("give a parent hash or a salt, not both (the parent already has one)")
    arr = np.asarray(tokens)
    out: list[BlockHash] = []
    for start in range(0, arr.size - block_tokens + 1, block_tokens):
        parent = hash_block(parent, arr[start : start + block_tokens])
        out.append(parent)
    return out


def block_key(model: str, dtype: str, block_tokens: int, h: BlockHash) -> ObjectKey:
    """Store object key of one KV block (all layers): ``{model}/{dtype}/{block_tokens}/{hash}``."""
    return ObjectKey(f"{model}/{dtype}/{block_tokens}/{int(h):016x}")


def rank_key(block: str, rank: int, size: int) -> ObjectKey:
    """Store key of tensor-parallel rank ``rank``'s share (of ``size`` ranks) of a block:
    ``{block_key}/tp{rank}of{size}``. Each rank holds its own heads, so each rank's share is
    its own object and no rank can read another's (nor one of another TP size)."""
    if not 0 <= rank < size:
        raise ValueError(f"tensor-parallel rank {rank} outside [0, {size})")
    return ObjectKey(f"{block}/tp{rank}of{size}")


def parse_block_key(key: str) -> tuple[BlockHash, int, int] | None:
    """``(block hash, rank, TP size)`` of a :func:`block_key` (rank 0 of 1) or a
    :func:`rank_key`; None for any other key. Events and indexes name a block by the hash
    alone, once, whatever the number of ranks."""
    head, _, last = key.rpartition("/")
    rank, size = 0, 1
    if last.startswith("tp") and "of" in last:
        r, _, n = last[2:].partition("of")
        if not (r.isdigit() and n.isdigit() and int(r) < int(n)):
            return None
        rank, size = int(r), int(n)
        last = head.rpartition("/")[2]
    if len(last) != 16 or not all(c in _HEX for c in last):
        return None
    return BlockHash(int(last, 16)), rank, size


def common_prefix_blocks(a: Iterable[BlockHash], b: Iterable[BlockHash]) -> int:
    """Number of leading blocks two hash chains share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
