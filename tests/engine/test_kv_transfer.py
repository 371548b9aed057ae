"""KV blocks copied out as bytes (whole blocks, or layer by layer while prefill runs) and written
into another engine instance's blocks reproduce the continuation — what P/D disaggregation needs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kvcake.core.api import SamplingParams
from kvcake.core.ids import RequestId
from kvcake.engine.backend import DecodeSeq

STEPS = 5


@pytest.fixture(scope="module")
def second(backend: Any) -> Iterator[Any]:
    """Another engine on the same (memory-mapped) weights with its own, smaller KV region."""
    from kvcake.engine.config import EngineConfig
    from kvcake.engine.torch_backend import TorchBackend

    be = TorchBackend(EngineConfig(num_kv_blocks=12, threads=1))
    yield be
    be.blocks.check()
    be.close()


def _continue(be: Any, table: list[int], n: int, first: int) -> list[int]:
    seq = DecodeSeq(RequestId("x"), table, n, first, SamplingParams(ignore_eos=True))
    return [first] + [be.decode([seq])[0] for _ in range(STEPS - 1)]


def _prompt(be: Any) -> list[int]:
    ids: list[int] = be.tokenizer.encode(
        "Photosynthesis is the process by which green plants use sunlight, water and carbon "
        "dioxide to make glucose and oxygen. It happens in the chloroplasts, mainly in the"
    )
    return ids


def test_blocks_exported_and_imported_reproduce_continuation(fresh: Any, second: Any) -> None:
    ids = _prompt(fresh)
    n_blocks = fresh.blocks_needed(len(ids) + STEPS)
    src = fresh.allocate_blocks(n_blocks)
    pad = second.allocate_blocks(2)  # so the destination block ids differ from the source's
    dst = second.allocate_blocks(n_blocks)
    try:
        first = fresh.prefill(ids, src, 0, SamplingParams())
        data = fresh.export_blocks(src[: fresh.blocks_needed(len(ids))])
        assert len(data) == fresh.blocks_needed(len(ids)) * fresh.layout.block_bytes
        second.import_blocks(dst[: fresh.blocks_needed(len(ids))], data)
        want = _continue(fresh, src, len(ids), first)
        assert _continue(second, dst, len(ids), first) == want
    finally:
        fresh.free_blocks(src)
        second.free_blocks(dst + pad)


def test_layerwise_streaming_reproduces_continuation(fresh: Any, second: Any) -> None:
    ids = _prompt(fresh)[:-3]
    n = fresh.blocks_needed(len(ids) + STEPS)
    src, dst = fresh.allocate_blocks(n), second.allocate_blocks(n)
    region_src, region_dst = fresh.memory.bytes, second.memory.bytes
    streamed: list[int] = []

    def on_layer(layer: int) -> None:  # what serve does with Transfer Engine WRITEs
        streamed.append(layer)
        for bs, bd in zip(src, dst, strict=True):
            off_s, size = fresh.layout.layer_range(bs, layer)
            off_d, size_d = second.layout.layer_range(bd, layer)
            assert size == size_d
            region_dst[off_d : off_d + size] = region_src[off_s : off_s + size]

    try:
        first = fresh.prefill(ids, src, 0, SamplingParams(), on_layer_done=on_layer)
        assert streamed == list(range(fresh.num_layers))
        want = _continue(fresh, src, len(ids), first)
        assert _continue(second, dst, len(ids), first) == want
    finally:
        fresh.free_blocks(src)
        second.free_blocks(dst)


def test_blocks_written_from_outside_are_reused_by_hash(fresh: Any, second: Any) -> None:
    """Blocks filled by an import and registered under their hash serve as a cached prefix."""
    ids = _prompt(fresh)
    full = (len(ids) // fresh.block_tokens) * fresh.block_tokens
    hashes = fresh.block_hashes(ids)
    src = fresh.allocate_blocks(fresh.blocks_needed(len(ids)))
    fresh.prefill(ids, src, 0, SamplingParams())
    data = fresh.export_blocks(src[: len(hashes)])
    fresh.free_blocks(src)
    got = second.allocate_blocks(len(hashes))
    second.import_blocks(got, data)
    assert second.register_blocks(got, hashes) == len(hashes)
    second.free_blocks(got)
    table = second.lookup_prefix(hashes)
    assert table == got
    second.ensure_capacity(table, len(ids) + STEPS)
    first = second.prefill(ids, table, full, SamplingParams())
    src2 = fresh.allocate_blocks(len(table))
    assert first == fresh.prefill(ids, src2, 0, SamplingParams())
    fresh.free_blocks(src2)
    second.free_blocks(table)
