"""Strategies, disk tier files and the disk service (real sockets), store-server config errors."""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

import pytest

from kvcake.core import framing
from kvcake.core.ids import ClientId, SegmentName
from kvcake.core.integrity import checksums
from kvcake.store.config import MasterConfig
from kvcake.store.disk import REP, DiskService, DiskTier, read_remote
from kvcake.store.errors import ChecksumMismatch, InvalidParams, ObjectNotFound, RpcFailed
from kvcake.store.master_state import MasterState
from kvcake.store.metadata import Tier
from kvcake.store.protocol import PutOptions
from kvcake.store.strategy import STRATEGIES, make


class Seg:
    def __init__(self, name: str, host: str, free: float):
        self.name, self.host, self._free = name, host, free

    def free_ratio(self) -> float:
        return self._free


def test_strategies() -> None:
    segs = [Seg("a", "h1", 0.1), Seg("b", "h2", 0.9), Seg("c", "h1", 0.5)]
    rng = random.Random(0)
    assert set(STRATEGIES) >= {"random", "free_ratio_first", "local_first"}
    assert [s.name for s in make("free_ratio_first").order(segs, "h9", rng)] == ["b", "c", "a"]
    assert {s.name for s in make("local_first").order(segs, "h1", rng)[:2]} == {"a", "c"}
    starts = {make("random").order(segs, "h1", rng)[0].name for _ in range(50)}
    assert starts == {"a", "b", "c"}  # random start, all segments kept
    assert make("random").order([], "h", rng) == []


def test_disk_quota_limits_offload() -> None:
    st = MasterState(MasterConfig(eviction_ratio=0.5))
    a = ClientId("a")
    st.mount(a, "h", SegmentName("mem"), 16 * 1024)
    st.mount(a, "h", SegmentName("mem.ssd"), 8 * 1024, Tier.DISK, "h:1")
    for i in range(4):
        st.put_start(a, "h", f"o{i}", 4096, PutOptions())
        st.put_end(a, f"o{i}")
    st.evict(16 * 1024, offload=True, timed=False)
    kinds = [t.kind for t in st.take_tasks(a)]
    assert kinds == ["offload", "offload"]  # the 8 KiB quota holds two; the rest were dropped
    assert len(st.objects) == 2
    st.check()


def test_disk_tier_files(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path)
    tier.write("k", memoryview(b"hello world"), checksums("k", b"hello world"))
    out = bytearray(11)
    assert tier.read_into("k", memoryview(out)) == 11 and out == b"hello world"
    with pytest.raises(ObjectNotFound):
        tier.read_into("other", memoryview(out))
    path = tier.path("k")
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(ChecksumMismatch):
        tier.read_into("k", memoryview(out))
    assert not path.exists()  # a corrupt copy is dropped at once
    tier.write("a", memoryview(b"x" * 100), checksums("a", b"x" * 100))
    tier.write("b", memoryview(b"y" * 100), checksums("b", b"y" * 100))
    tier.path("b").write_bytes(tier.path("b").read_bytes()[:-1])  # torn write
    (tmp_path / "stray.tmp123").write_bytes(b"junk")
    fresh = DiskTier(tmp_path)
    assert fresh.scan() == [("a", 100, checksums("a", b"x" * 100))]
    assert sorted(p.name for p in tmp_path.iterdir()) == [tier.path("a").name]


def test_disk_service_bad_input(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path)
    tier.write("k", memoryview(b"v" * 1000), checksums("k", b"v" * 1000))
    svc = DiskService(tier, "127.0.0.1")
    svc.start()
    try:
        addr = svc.addresses[0]
        out = bytearray(1000)
        read_remote(addr, "k", memoryview(out))
        assert out == b"v" * 1000
        with pytest.raises(ObjectNotFound):
            read_remote(addr, "missing", memoryview(out))
        with pytest.raises(InvalidParams):
            read_remote(addr, "k", memoryview(bytearray(10)))  # wrong size
        host, port = addr.split(":")
        for junk in (
            b"garbage" * 10,
            framing.pack_header(1, 1 << 30),
            b"KC\x01\x00" + b"\xff" * 20,
        ):
            data = b""
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(junk)
                with contextlib.suppress(OSError):  # the service may have answered and closed
                    s.shutdown(socket.SHUT_WR)
                with contextlib.suppress(OSError):
                    while chunk := s.recv(1 << 16):
                        data += chunk
            # The service half-closes after its reply, so the reply always arrives intact.
            assert REP.decode(data[framing.HEADER_SIZE :]).code == -600
        read_remote(addr, "k", memoryview(out))  # still serving
    finally:
        svc.stop()
    with pytest.raises(RpcFailed):
        read_remote(addr, "k", memoryview(out))


def test_bad_config_exits_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    """In-process CLI (no server starts on these paths): exit 2 and a message naming the cause."""
    from kvcake.cli import main

    cases = [
        (["store-server", "--segment-size", "0"], "segment_size"),
        (
            ["store-server", "--master", "127.0.0.1:1", "--segment-size", "1MB"],
            "cannot reach master",
        ),
        (["master", "--port", "0", "--allocation-strategy", "x"], "allocation_strategy"),
        (["master", "--high-watermark", "2"], "high_watermark"),
    ]
    for argv, needle in cases:
        assert main(argv) == 2
        assert needle in capsys.readouterr().err
