"""The layout header of LMCache chunks in kvcake (pure logic, the project's venv)."""

from __future__ import annotations

import pytest

from kvcake.integrations.lmcache import layout as L

FULL = L.Layout("KV_2LTD", (L.Group("torch.bfloat16", 2, (2, 3, 16, 16)),))


def _with(
    dtype: str = "torch.bfloat16", shape: tuple[int, ...] = (2, 3, 16, 16), fmt: str = "KV_2LTD"
) -> L.Layout:
    return L.Layout(fmt, (L.Group(dtype, 2, shape),))


def test_round_trip_and_partial_chunk() -> None:
    blob = L.encode(FULL) + bytes(FULL.nbytes)
    layout, offset = L.decode(blob)
    assert layout == FULL and len(blob) - offset == FULL.nbytes
    L.check(layout, FULL)
    L.check(_with(shape=(2, 3, 8, 16)), FULL)  # a prompt's last, partial chunk


@pytest.mark.parametrize(
    "stored",
    [
        _with(dtype="torch.float16"),
        _with(shape=(2, 4, 16, 16)),  # another layer count
        _with(shape=(2, 3, 32, 16)),  # more tokens than a chunk
        _with(shape=(2, 3, 16, 8)),
        _with(shape=(3, 16, 16)),
        _with(fmt="KV_MLA_FMT"),
        L.Layout("KV_2LTD", ()),
    ],
)
def test_other_layouts_are_mismatches(stored: L.Layout) -> None:
    with pytest.raises(L.LayoutMismatch):
        L.check(stored, FULL)


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"raw bytes someone else put",
        L.encode(FULL) + bytes(FULL.nbytes - 1),  # truncated payload
        L.encode(FULL).replace(b"KVCAKELM", b"KVCAKELX") + bytes(FULL.nbytes),
        L.encode(FULL)[:-3] + b"}}}" + bytes(FULL.nbytes),  # corrupt JSON
    ],
)
def test_foreign_or_torn_objects_are_mismatches(blob: bytes) -> None:
    with pytest.raises(L.LayoutMismatch):
        L.decode(blob)
