"""Mooncake's ``--root_fs_dir`` (DISK replicas) over kvcake's file tier: a master started with
``mooncake_master``'s ``--enable_offload=true --root_fs_dir=D --cluster_id=C`` makes the shim's
clients write every put through to a file under ``D/C/``, and keys whose memory copies were
evicted read back from there (test_ssd_offload_in_evict.py: 1000/1000 on the 0.3.13 wheel)."""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

import numpy as np
import pytest

from kvcake.compat.mooncake import MooncakeDistributedStore
from tests.compat.test_mooncake_master_flags import master_config
from tests.store.conftest import Factory

MB = 1024 * 1024


def test_flags_map_onto_the_file_tier() -> None:
    cfg = master_config("--enable_offload=true", "--root_fs_dir=/srv/fs", "--quota_bytes=1048576")
    assert cfg.root_fs_dir == Path("/srv/fs") and cfg.root_fs_quota == MB
    assert master_config("--root-fs-dir=/a", "--root_fs_dir=/b").root_fs_dir == Path("/a")
    assert master_config().root_fs_dir is None


def test_master_help_lists_the_file_tier_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from kvcake.cli import build_parser

    with pytest.raises(SystemExit) as done:  # a "%" in a flag's help once broke --help
        build_parser().parse_args(["master", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--root-fs-dir" in out and "--root_fs_dir" in out and "--quota_bytes" in out


def test_evicted_keys_read_back_from_root_fs_dir(procs: Factory, tmp_path: Path) -> None:
    root = tmp_path / "fs"
    master = procs(
        "master", "--port", "0", "--http-port", "-1", "--enable_offload=true",
        f"--root_fs_dir={root}", "--cluster_id=mc1", "--default_kv_lease_ttl=200",
    )  # fmt: skip
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 8 * MB, 16 * MB, "tcp", "", master.info["rpc"])
    assert rc == 0  # no SSD tier of its own (enable_ssd_offload=False), as the suite
    rng = np.random.default_rng(0)
    ref = {f"k_{i}": rng.integers(0, 256, MB, dtype=np.uint8).tobytes() for i in range(24)}
    assert [s.put(k, v) for k, v in ref.items()] == [0] * len(ref)  # 3x the segment
    assert [k for k, v in ref.items() if s.get(k) != v] == []  # evicted ones: from files
    deadline = time.monotonic() + 10  # the last puts' files are written in the background
    while len(list((root / "mc1").rglob("*.obj"))) < len(ref) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(list((root / "mc1").rglob("*.obj"))) == len(ref)
    desc = s.get_replica_desc("k_0")
    assert any(d.is_disk_replica() for d in desc)
    buf = (ctypes.c_ubyte * (4 * MB))()
    ptr = ctypes.addressof(buf)
    assert s.register_buffer(ptr, 4 * MB) == 0
    keys = ["k_0", "k_1", "k_22", "k_23"]
    got = s.batch_get_into(keys, [ptr + i * MB for i in range(4)], [MB] * 4)
    assert got == [MB] * 4
    assert all(bytes(buf[i * MB : (i + 1) * MB]) == ref[k] for i, k in enumerate(keys))
    assert s.unregister_buffer(ptr) == 0
    time.sleep(0.3)  # the reads' leases (200 ms)
    assert [s.remove(k) for k in ref] == [0] * len(ref)
    deadline = time.monotonic() + 10
    while list((root / "mc1").rglob("*.obj")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list((root / "mc1").rglob("*.obj")) == []  # remove deletes the files
    assert s.close() == 0
