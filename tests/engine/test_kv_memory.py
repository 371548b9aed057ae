from __future__ import annotations

import itertools
import mmap
from pathlib import Path

import numpy as np
import pytest

from kvcake.core.errors import EngineError
from kvcake.engine.kv_memory import KVLayout, KVMemory

LAYOUT = KVLayout(num_blocks=4, num_layers=3, block_tokens=8, kv_heads=2, head_dim=4)


def test_offsets_are_contiguous_per_block_and_per_layer() -> None:
    L = LAYOUT
    assert L.token_bytes == 2 * 4 * 4
    assert L.layer_bytes == 2 * 8 * L.token_bytes
    assert L.block_bytes == 3 * L.layer_bytes
    assert L.total_bytes == 4 * L.block_bytes
    assert L.kv_bytes_per_token * L.block_tokens == L.block_bytes
    for b in range(L.num_blocks):
        assert L.block_offset(b) == b * L.block_bytes
        ranges = [L.layer_range(b, layer) for layer in range(L.num_layers)]
        # layers tile the block exactly, in order
        assert ranges[0][0] == L.block_offset(b)
        for (o1, n1), (o2, _) in itertools.pairwise(ranges):
            assert o1 + n1 == o2
        assert ranges[-1][0] + ranges[-1][1] == L.block_offset(b) + L.block_bytes


def test_layer_range_matches_array_view() -> None:
    mem = KVMemory(LAYOUT)
    arr = mem.blocks_array()
    arr[2, 1] = 7  # block 2, layer 1, K and V
    off, n = LAYOUT.layer_range(2, 1)
    assert (mem.bytes[off : off + n] == 7).all()
    assert int(mem.bytes.sum()) == 7 * n
    mem.close()


def test_export_import_round_trip_between_regions() -> None:
    a, b = KVMemory(LAYOUT), KVMemory(LAYOUT)
    a.bytes[:] = np.random.default_rng(0).integers(0, 256, LAYOUT.total_bytes, dtype=np.uint8)
    data = a.export_blocks([3, 1])
    assert len(data) == 2 * LAYOUT.block_bytes
    b.import_blocks([0, 2], data)
    assert b.block_view(0).tobytes() == a.block_view(3).tobytes()
    assert b.block_view(2).tobytes() == a.block_view(1).tobytes()
    assert not b.bytes[LAYOUT.block_offset(1) : LAYOUT.block_offset(2)].any()
    a.close()
    b.close()


def test_external_buffer_is_used_in_place() -> None:
    buf = mmap.mmap(-1, LAYOUT.total_bytes + 100)
    mem = KVMemory(LAYOUT, buffer=buf)
    mem.blocks_array()[1, 0, 0, 0, 0] = 42
    assert buf[LAYOUT.block_offset(1)] == 42
    mem.close()
    buf.close()


def test_shm_backed_region_is_visible_and_removed_on_close() -> None:
    name = f"kvcake-test-{np.random.default_rng().integers(1 << 30)}"
    mem = KVMemory(LAYOUT, shm_name=name)
    path = Path("/dev/shm") / name
    assert mem.shm_path == path and path.stat().st_size == LAYOUT.total_bytes
    mem.bytes[5] = 9
    mem.close()
    assert not path.exists()


def test_bad_inputs_raise_engine_errors() -> None:
    with pytest.raises(EngineError):
        KVLayout(num_blocks=0, num_layers=1, block_tokens=1, kv_heads=1, head_dim=1)
    with pytest.raises(EngineError):
        KVLayout(num_blocks=1, num_layers=1, block_tokens=1, kv_heads=1, head_dim=1, dtype="int7")
    with pytest.raises(EngineError):
        KVMemory(LAYOUT, buffer=bytearray(10))  # too small
    with pytest.raises(EngineError):
        KVMemory(LAYOUT, buffer=bytes(LAYOUT.total_bytes))  # read-only
    mem = KVMemory(LAYOUT)
    with pytest.raises(EngineError):
        LAYOUT.block_offset(4)
    with pytest.raises(EngineError):
        LAYOUT.layer_range(0, 3)
    with pytest.raises(EngineError):
        mem.import_blocks([0], b"short")
    with pytest.raises(EngineError):
        mem.export_blocks([-1])
    mem.close()
