"""Shared builders for conductor tests: small clusters with round-number cost coefficients so
every expected TTFT/TBT can be computed by hand."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from kvcake.conductor import (
    DecodeTBTModel,
    Predictors,
    PrefillTimeModel,
    PrefixIndex,
    TransferTimeModel,
)
from kvcake.core.api import ClusterSnapshot, DecodeState, KVIndex, PrefillState, RequestView
from kvcake.core.costmodel import DecodeCoefficients, PrefillCoefficients
from kvcake.core.ids import BlockHash, InstanceId, RequestId

BT = 10  # tokens per block
KVB = 100  # KV bytes per token
LINK = 100_000.0  # bytes/s -> 0.001 s per token
# prefill(L, P) = 1 + 0.01 * (L - P)   (no quadratic term: easy hand arithmetic)
PRE = PrefillCoefficients(c0=1.0, c1=0.01, c2=0.0)
# tbt(batch, ctx) = 0.01 + 0.001 * batch + 1e-6 * ctx
DEC = DecodeCoefficients(d0=0.01, d1=0.001, d2=1e-6)
PRED = Predictors(PrefillTimeModel(PRE), TransferTimeModel(0.0), DecodeTBTModel(DEC))


def iid(name: str) -> InstanceId:
    return InstanceId(name)


def blocks(n: int, base: int = 1000) -> tuple[BlockHash, ...]:
    return tuple(BlockHash(base + i) for i in range(n))


def request(
    n_blocks: int = 10, prompt_len: int | None = None, out: int = 50, rid: str = "r"
) -> RequestView:
    return RequestView(
        RequestId(rid), 0.0, n_blocks * BT if prompt_len is None else prompt_len,
        blocks(n_blocks), out,
    )  # fmt: skip


def index_with(holdings: dict[str, int], cls: type[KVIndex] = PrefixIndex, n: int = 10) -> KVIndex:
    """``holdings[name] = k``: holder ``name`` holds the first ``k`` of ``blocks(n)``."""
    idx = cls()
    for name, k in holdings.items():
        idx.add(iid(name), blocks(n)[:k])
        idx.add(
            iid(name), blocks(5, base=zlib.crc32(name.encode()) % 10_000 * 100 + 50_000)
        )  # unrelated
    return idx


def decode(
    name: str = "d0", running: int = 0, ctx: int = 0, cap: int = 10**6, **kw: int | bool
) -> DecodeState:
    return DecodeState(iid(name), running, ctx, cap, **kw)  # type: ignore[arg-type]


def snapshot(
    prefill: Sequence[PrefillState],
    index: KVIndex,
    decodes: Sequence[DecodeState] = (),
    now: float = 0.0,
) -> ClusterSnapshot:
    dec = tuple(decodes) if decodes else (decode(),)
    return ClusterSnapshot(now, tuple(prefill), dec, index, BT, KVB, LINK)


def pstate(name: str, queued: float, healthy: bool = True, bw: float = 0.0) -> PrefillState:
    return PrefillState(iid(name), queued, fetch_bandwidth=bw, healthy=healthy)
