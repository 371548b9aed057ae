"""Block identity for vLLM engines: kvcake's chained hash over token ids, never vLLM's own hash.

Keys are ``core.hashing.block_key(model, dtype, block_tokens, hash)``, so two engines serving the
same model with the same dtype and block size name equal prefixes equally, whatever their
``PYTHONHASHSEED`` or vLLM version. A tenant salt changes the chain's root.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvcake.core.hashing import block_hashes, block_key, salted_root
from kvcake.core.ids import BlockHash


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

    def keys(self, tokens: Sequence[int]) -> list[str]:
        """Store keys of every full block of ``tokens`` (a trailing partial block has none)."""
        root = tenant_root(self.tenant)
        return [
            block_key(self.model, self.dtype, self.block_tokens, h)
            for h in block_hashes(tokens, self.block_tokens, root)
        ]
