"""Gaps found by running more of Mooncake's own suites over the shim (docs/compat/mooncake.md,
"Mooncake's own test suites"): each test pins what the 0.3.13 wheel does."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcake.compat.mooncake import MooncakeDistributedStore
from kvcake.compat.mooncake._fast_copy import concat_arrays_into
from kvcake.core.errors import ConfigError
from tests.compat.test_mooncake_master_flags import master_config
from tests.store.conftest import Factory
from tests.store.procs import Proc

MB = 1024 * 1024


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


def test_offload_suites_master_flags() -> None:
    """test_local_disk_get.py / test_promotion_on_hit.py start mooncake_master with these."""
    cfg = master_config(
        "--enable_offload=true", "--offload_on_evict=true", "--root_fs_dir=/tmp/x",
        "--promotion_on_hit=true", "--promotion_admission_threshold=4",
        "--promotion_max_per_heartbeat=1", "--promotion_queue_limit=100",
    )  # fmt: skip
    assert cfg.offload_on_evict is True and cfg.promote_after_hits == 4
    assert master_config("--promotion_admission_threshold=0").promote_after_hits == 1
    assert (
        master_config(
            "--promote-after-hits=3", "--promotion_admission_threshold=9"
        ).promote_after_hits
        == 3
    )
    for bad in ("often", "-1"):
        with pytest.raises(ConfigError, match="bad count"):
            master_config(f"--promotion_admission_threshold={bad}")


def ssd_store(master: Proc, tmp_path: Path, segment: int, buffer: int = 8 * MB) -> Any:
    """A Mooncake store set up as the SSD-offload suites do (nine arguments, tcp)."""
    s = MooncakeDistributedStore()
    rc = s.setup(
        "127.0.0.1", "P2PHANDSHAKE", segment, buffer, "tcp", "", master.info["rpc"],
        None, True, str(tmp_path / "ssd"),
    )  # fmt: skip
    assert rc == 0
    return s


def test_master_with_offload_flags_serves_an_ssd_client(procs: Factory, tmp_path: Path) -> None:
    master = procs(
        "master", "--port", "0", "--http-port", "0", "--client-ttl-s", "1",
        "--enable_offload=true", f"--root_fs_dir={tmp_path / 'fs'}", "--promotion_on_hit=true",
        "--promotion_admission_threshold=1",
    )  # fmt: skip
    s = ssd_store(master, tmp_path, 8 * MB)
    assert s.put("k", b"v" * 1000) == 0 and s.get("k") == b"v" * 1000
    assert s.close() == 0


def test_two_ssd_stores_in_one_process(master_proc: Proc, tmp_path: Path) -> None:
    """test_promotion_on_hit.py: each test class sets up its own SSD store on "localhost"."""
    stores = [MooncakeDistributedStore() for _ in range(2)]
    for i, s in enumerate(stores):
        rc = s.setup(
            "localhost", "P2PHANDSHAKE", 4 * MB, 4 * MB, "tcp", "", master_proc.info["rpc"],
            None, True, str(tmp_path / f"ssd{i}"),
        )  # fmt: skip
        assert rc == 0
        assert s.put(f"k{i}", bytes([i]) * 100) == 0
    assert [s.get(f"k{i}") for i, s in enumerate(stores)] == [b"\0" * 100, b"\1" * 100]
    assert stores[1].get("k0") == b"\0" * 100  # one cluster
    assert all(s.close() == 0 for s in stores)


def test_every_acknowledged_put_survives_an_overflowing_ssd_store(
    procs: Factory, tmp_path: Path
) -> None:
    """Mooncake's test_local_disk_get.py, shrunk: 32 x 1 MiB into an 8 MiB segment with the
    client-side SSD tier. Puts that find memory full wait for offloads (SpacePending) rather
    than the master dropping objects that had not reached the disk; every key acknowledged
    with 0 reads back its bytes. (Before: 2-6 of 64 acknowledged keys were lost.)"""
    master = procs(
        "master", "--port", "0", "--http-port", "-1", "--enable_offload=true",
        f"--root_fs_dir={tmp_path / 'fs'}", "--default_kv_lease_ttl=200",
    )  # fmt: skip
    s = ssd_store(master, tmp_path, 8 * MB, 16 * MB)
    rng = np.random.default_rng(0)
    ref = {f"ldg_{i}": rng.integers(0, 256, MB, dtype=np.uint8).tobytes() for i in range(32)}
    acked = [k for k, v in ref.items() if s.put(k, v) == 0]
    assert len(acked) == len(ref)  # the puts wait for room instead of failing
    lost = [k for k in acked if s.get(k) != ref[k]]
    assert lost == []
    assert s.close() == 0
