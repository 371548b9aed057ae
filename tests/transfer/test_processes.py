"""Two processes: ``kvcake transfer-server`` children, TCP and the same-host shm path, stale
shared-memory cleanup after a kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from kvcake.core.ids import SegmentName
from kvcake.transfer import Op, TransferRequest, UnknownSegment
from kvcake.transfer.shm import PREFIX, SHM_DIR, cleanup_stale, create_region, is_stale

from .conftest import EngineFactory, pattern

S = SegmentName


@pytest.mark.parametrize("memory,expect", [("shm", "shm"), ("heap", "tcp")])
def test_cross_process_transfer(
    make_engine: EngineFactory, directory, server_proc, memory: str, expect: str
) -> None:  # type: ignore[no-untyped-def]
    srv = server_proc(
        "--directory", directory.address, "--segment", "remote:4MiB", "--memory", memory
    )
    a = make_engine()
    info = a.segment_info("remote")
    assert info.shm_backed is (memory == "shm")
    assert info.owner == srv.info["owner"]
    assert a._transport_for(info).name == expect
    src = pattern(4 << 20, seed=30)
    a.register_memory("a", src)
    reqs = [
        TransferRequest(Op.WRITE, S("a"), o, S("remote"), o, 1 << 20)
        for o in range(0, 4 << 20, 1 << 20)
    ]
    assert a.wait(a.submit(reqs), 30).ok
    back = bytearray(4 << 20)
    a.read_into("remote", 0, back)
    assert zlib.crc32(back) == zlib.crc32(src)
    assert srv.stop() == 0  # SIGTERM: clean exit, segment unpublished, shm unlinked
    with pytest.raises(UnknownSegment):
        a.segment_info("remote")
    assert not [f for f in os.listdir(SHM_DIR) if f.startswith(f"{PREFIX}{srv.proc.pid}-")]


def test_forced_tcp_to_a_shm_segment(make_engine: EngineFactory, directory, server_proc) -> None:  # type: ignore[no-untyped-def]
    server_proc("--directory", directory.address, "--segment", "r:1MiB")
    a = make_engine(protocol="tcp")
    assert a._transport_for(a.segment_info("r")).name == "tcp"
    a.write("r", 10, b"over tcp")
    out = bytearray(8)
    a.read_into("r", 10, out)
    assert out == b"over tcp"


def test_forced_shm_cannot_reach_heap_segment(make_engine: EngineFactory) -> None:
    a = make_engine(protocol="shm")
    b = make_engine()
    b.register_memory("heap", bytearray(100))
    a.register_memory("a", bytearray(100))
    res = a.transfer([TransferRequest(Op.WRITE, S("a"), 0, S("heap"), 0, 10)])
    assert res.results[0].error_type == "TransferError"
    assert "cannot reach" in (res.results[0].error or "")


def test_stale_shm_of_killed_process_is_cleaned(tmp_path: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path; from kvcake.transfer.shm import create_region;"
        f"r = create_region('victim', 4096, Path({str(tmp_path)!r})); print(r.path, flush=True);"
        "time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        path = Path(child.stdout.readline().strip())
        assert path.exists() and not is_stale(path)  # owner alive: its lock protects the file
        mine = create_region("mine", 4096, tmp_path)
        assert cleanup_stale(tmp_path) == []
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert is_stale(path)
        assert cleanup_stale(tmp_path, dry_run=True) == [path] and path.exists()
        assert cleanup_stale(tmp_path) == [path]
        assert not path.exists() and mine.path.exists()
        mine.close()
        assert not mine.path.exists()
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        if child.stdout:
            child.stdout.close()


def test_cleanup_command(tmp_path: Path) -> None:
    env = {**os.environ, "KVCAKE_SHM_DIR": str(tmp_path)}
    dead = tmp_path / f"{PREFIX}999999999-abcd-x"  # no such pid, nobody holds its lock
    dead.write_bytes(b"x")
    unrelated = tmp_path / "other-file"
    unrelated.write_bytes(b"y")
    out = subprocess.run(
        [sys.executable, "-m", "kvcake", "transfer", "cleanup"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert f"removed {dead}" in out.stdout
    assert not dead.exists() and unrelated.exists()


def test_transfer_server_rejects_bad_config() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvcake", "transfer-server", "--segment", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "NAME:SIZE" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "kvcake", "transfer-server"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "--metadata" in out.stderr


def test_shm_single_copy_skips_the_batch_machinery(
    make_engine: EngineFactory, directory, server_proc
) -> None:  # type: ignore[no-untyped-def]
    server_proc("--directory", directory.address, "--segment", "r:4MiB")
    a = make_engine()
    a._new_batch = None  # type: ignore[assignment]  # a single shm copy must not need a batch
    src = pattern(2 << 20, seed=31)
    a.write("r", 4096, src)
    back = bytearray(2 << 20)
    a.read_into("r", 4096, back)
    assert back == src
    with pytest.raises(Exception, match="out of range|beyond|exceeds"):
        a.read_into("r", (4 << 20) - 4, bytearray(8))
