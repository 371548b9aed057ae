"""Gaps found by running more of Mooncake's own suites over the shim (docs/compat/mooncake.md,
"Mooncake's own test suites"): each test pins what the 0.3.13 wheel does."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvcake.compat.mooncake._fast_copy import concat_arrays_into


def test_fast_copy_gathers_the_selected_range() -> None:
    arrays = [np.arange(3, dtype=np.uint8), np.arange(4, dtype=np.int16), np.ones(2, np.float32)]
    dest = ctypes.create_string_buffer(64)
    copied = concat_arrays_into(arrays, ctypes.addressof(dest), len(dest), 1, 2)
    assert copied == 8 + 8
    assert dest.raw[:copied] == arrays[1].tobytes() + arrays[2].tobytes()
    assert dest.raw[copied:] == b"\0" * (64 - copied)  # nothing past the copied bytes
    # start/count are clamped as the C extension clamps them; count < 0 means "to the end"
    assert concat_arrays_into(arrays, ctypes.addressof(dest), 64, -5, -1, 4) == 3 + 8 + 8
    assert dest.raw[:19] == b"".join(a.tobytes() for a in arrays)
    assert concat_arrays_into(arrays, ctypes.addressof(dest), 64, 7) == 0
    assert concat_arrays_into([], 0, 0) == 0


def test_fast_copy_refuses_before_copying_anything() -> None:
    dest = ctypes.create_string_buffer(8)
    good, strided = np.full(4, 7, np.uint8), np.arange(8, dtype=np.uint8)[::2]
    with pytest.raises(ValueError, match=r"need 12 bytes, got 8"):
        concat_arrays_into([good, good, good], ctypes.addressof(dest), 8)
    with pytest.raises(ValueError, match=r"arrays\[1\] is not C-contiguous"):
        concat_arrays_into([good, strided], ctypes.addressof(dest), 8)
    with pytest.raises(TypeError, match=r"arrays\[0\] is not an ndarray"):
        concat_arrays_into([b"abcd"], ctypes.addressof(dest), 8)
    with pytest.raises(TypeError, match="must be list"):
        concat_arrays_into((good,), ctypes.addressof(dest), 8)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        concat_arrays_into([good], ctypes.addressof(dest), dest_size=8)  # type: ignore[call-arg]
    assert dest.raw == b"\0" * 8


def test_shim_serves_fast_copy(tmp_path: Path) -> None:
    from kvcake.compat.mooncake import shim

    shim.install(tmp_path)
    probe = (
        "import ctypes, numpy as np, mooncake._fast_copy as f\n"
        "d = ctypes.create_string_buffer(4)\n"
        "print(f.concat_arrays_into([np.arange(4, dtype=np.uint8)], ctypes.addressof(d), 4),"
        " d.raw.hex())\n"
    )
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["4", "00010203"]
