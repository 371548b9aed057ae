"""PagedKV: vLLM's paged KV tensors <-> pool rows (pure torch, no vLLM process)."""

from __future__ import annotations

import pytest
import torch

from kvcake.integrations.vllm.paged import LayoutError, PagedKV


def cpu_layers(n_layers: int = 3, blocks: int = 8) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    # vLLM CPU (LBHNC): [num_blocks, kv_heads, block_size, 2 * head_size]
    return {f"l{i}": torch.randn(blocks, 2, 4, 6, generator=g) for i in range(n_layers)}


def test_gather_scatter_roundtrip_into_other_blocks() -> None:
    src = cpu_layers()
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    a, b = PagedKV(src, 8), PagedKV(dst, 8)
    assert a.block_bytes == 3 * 2 * 4 * 6 * 4
    rows = a.empty(2)
    a.gather([5, 1], rows)
    b.scatter([0, 7], rows)
    for k in src:
        assert torch.equal(dst[k][0], src[k][5]) and torch.equal(dst[k][7], src[k][1])
        assert not dst[k][1:7].any()


def test_split_kv_layout_has_two_planes() -> None:
    t = torch.arange(2 * 5 * 3 * 2, dtype=torch.float32).view(2, 5, 3, 2)
    p = PagedKV({"l": t}, 5)
    assert len(p.planes) == 2
    rows = p.empty(1)
    p.gather([3], rows)
    assert torch.equal(rows[0], torch.cat([t[0, 3].flatten(), t[1, 3].flatten()]))


def test_bad_layouts_and_ids_raise() -> None:
    with pytest.raises(LayoutError):
        PagedKV({"l": torch.zeros(3, 4)}, 8)
    with pytest.raises(LayoutError):
        PagedKV({"l": torch.zeros(4, 8).t()}, 8)  # blocks not contiguous
    with pytest.raises(LayoutError):
        PagedKV({}, 8)
    p = PagedKV(cpu_layers(), 8)
    with pytest.raises(LayoutError):
        p.gather([8], p.empty(1))


def test_ranges_name_each_planes_row_of_a_block() -> None:
    """A pool object is the blocks' rows of every plane back to back: filling the ranges of
    block b with object bytes equals scattering that row into b."""
    src = cpu_layers()
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    a, b = PagedKV(src, 8), PagedKV(dst, 8)
    row = a.empty(1)
    a.gather([5], row)
    raw = memoryview(row[0].numpy()).cast("B")
    assert b.direct
    ranges = b.ranges(2)
    assert sum(v.nbytes for _, v in ranges) == b.block_bytes
    for off, view in ranges:
        view[:] = raw[off : off + view.nbytes]
    for k in src:
        assert torch.equal(dst[k][2], src[k][5])
        assert not dst[k][:2].any() and not dst[k][3:].any()
    with pytest.raises(LayoutError):
        b.ranges(8)


def test_tables_name_what_ranges_name() -> None:
    """A load hands the store tables (PagedKV.tables): the same destinations as ranges()."""
    t = torch.zeros(2, 6, 3, 2)  # split K/V: two planes per layer
    p = PagedKV({"a": t, "b": torch.zeros(6, 3, 4)}, 6)
    for block, table in zip([4, 0], p.tables([4, 0]), strict=True):
        want = [(off, bytes(v), v.nbytes) for off, v in p.ranges(block)]
        views = table.views()
        assert [off for off, _ in views] == [off for off, _, _ in want]
        for _, v in views:
            v[:] = bytes(range(1, v.nbytes + 1))
        got = [(off, bytes(v), v.nbytes) for off, v in p.ranges(block)]
        assert [(o, n) for o, _, n in got] == [(o, n) for o, _, n in want]
        assert all(b == bytes(range(1, n + 1)) for _, b, n in got)
    (group,) = p.tables([5], planes=[2])  # layer b only
    assert list(group.offsets) == [p.ranges(5)[2][0]] and group.nbytes == p.ranges(5)[2][1].nbytes
    with pytest.raises(LayoutError):
        p.tables([6])
