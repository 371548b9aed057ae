"""Shared-secret authentication of the Transfer Engine (issue 15 §3): every TCP connection to a
transfer server (and to the directory) passes an HMAC challenge before any frame is read.
Without the secret, or with a wrong one, not a byte of a segment is read or written and the
client gets a typed error."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvcake.core import auth, framing
from kvcake.core.errors import ConfigError
from kvcake.transfer import DirectoryService, TransferConfig, TransferEngine, TransferRequest
from kvcake.transfer.errors import AuthFailed
from kvcake.transfer.protocol import CODEC, Probe, ReadReq, WriteReq, WriteV
from kvcake.transfer.tcp_transport import probe
from kvcake.transfer.types import Op
from tests.rawsock import raw, read_all
from tests.waits import wait_until

from .conftest import pattern

SECRET = b"correct horse battery staple 15"
GOOD = auth.Authenticator(SECRET, handshake_timeout_s=2.0)
WRONG = auth.Authenticator(b"not the cluster secret, sorry", handshake_timeout_s=2.0)
CFG = TransferConfig(io_timeout_s=5.0, probe_interval_s=0.05, connect_timeout_s=2.0)


@pytest.fixture
def secured() -> Iterator[tuple[DirectoryService, TransferEngine, bytearray]]:
    svc = DirectoryService("127.0.0.1", 0, auth=GOOD)
    svc.start()
    target = TransferEngine(svc.address, protocol="tcp", config=CFG, auth=GOOD)
    mem = pattern(1 << 20, seed=15)
    target.register_memory("tgt/seg", mem)
    yield svc, target, mem
    target.close()
    svc.stop()


def connect(e: TransferEngine) -> socket.socket:
    return raw(e.addresses[0])


def test_same_secret_reads_and_writes(secured: tuple) -> None:  # type: ignore[type-arg]
    svc, target, mem = secured
    with TransferEngine(svc.address, protocol="tcp", config=CFG, auth=GOOD) as e:
        e.write("tgt/seg", 0, b"hello")
        out = bytearray(5)
        e.read_into("tgt/seg", 0, out)
        assert bytes(out) == b"hello" == bytes(mem[:5])
        src = pattern(3 << 20, seed=3)  # several slices, several lanes: the batch path
        e.register_memory("src", src)
        e.transfer([TransferRequest(Op.WRITE, "src", 0, "tgt/seg", 0, 1 << 20)]).raise_for_errors()
        assert bytes(mem) == bytes(src[: 1 << 20])
    assert target.server.auth_refused == 0


def test_handshake_is_per_connection_not_per_frame(secured: tuple) -> None:  # type: ignore[type-arg]
    svc, target, _mem = secured
    with TransferEngine(svc.address, protocol="tcp", config=CFG, auth=GOOD) as e:
        passed = target.server.auth_passed
        src = pattern(64 << 10, seed=5)
        e.register_memory("src2", src)
        for i in range(200):
            e.write("tgt/seg", (i * 4096) % (1 << 20), b"w" * 4096)
            e.transfer([TransferRequest(Op.WRITE, "src2", 0, "tgt/seg", 0, 64 << 10)])
        created = e.pool.stats()["created"]
        assert 1 <= target.server.auth_passed - passed == created <= CFG.streams + 1


@pytest.mark.parametrize("who", ["none", "wrong"])
def test_without_the_secret_nothing_is_written_or_read(secured: tuple, who: str) -> None:  # type: ignore[type-arg]
    _svc, target, mem = secured
    before = bytes(mem)
    # The directory is secured too: an engine without the secret looks segments up through
    # an authenticated one (the lookup is not what is under test).
    peer = target.segment_info("tgt/seg")
    key = auth.DISABLED if who == "none" else WRONG
    with TransferEngine(None, protocol="tcp", config=CFG, auth=key) as e:
        e.registry._cache["tgt/seg"] = peer  # type: ignore[attr-defined]
        with pytest.raises(AuthFailed, match="secret|authentication"):
            e.write("tgt/seg", 0, b"X" * 4096)
        out = bytearray(4096)
        with pytest.raises(AuthFailed):
            e.read_into("tgt/seg", 0, out)
        assert out == bytearray(4096)
        src = pattern(3 << 20, seed=4)
        e.register_memory("src", src)
        res = e.transfer([TransferRequest(Op.WRITE, "src", 0, "tgt/seg", 0, 1 << 20)])
        assert {r.error_type for r in res.results} == {"AuthFailed"}
        assert not probe(target.addresses[0], 2.0, None if who == "none" else WRONG)
    assert bytes(mem) == before
    wait_until(lambda: target.server.auth_refused >= 2, timeout=5, every_s=0.01,
               what="2 refusals counted")  # fmt: skip
    assert target.server.auth_refused >= 2


def test_raw_valid_frames_without_secret_are_refused_unread(secured: tuple) -> None:  # type: ignore[type-arg]
    _svc, target, mem = secured
    before = bytes(mem)
    for frame in (
        framing.pack_frame(CODEC, 1, WriteReq("tgt/seg", 0), b"Z" * 8192),
        framing.pack_frame(
            CODEC, 2, WriteV(["tgt/seg"], struct.pack("<3q", 0, 0, 4096)), b"Y" * 4096
        ),
        framing.pack_frame(CODEC, 3, ReadReq("tgt/seg", 0, 4096)),
        framing.pack_frame(CODEC, 4, Probe()),
    ):
        with connect(target) as s:
            s.sendall(frame)
            got = read_all(s)  # the server closes the connection
        assert got.startswith(auth.CHALLENGE)
        rest = got[len(auth.CHALLENGE) + auth.NONCE_SIZE :]
        assert rest.startswith(auth.VERDICT_NO) and b"requires authentication" in rest
        assert before[:4096] not in got  # no segment byte was sent back
        # A kvcake reader without the secret sees a typed error, not garbage.
        with pytest.raises(auth.AuthRequired, match="requires authentication"):
            framing.parse_header(got[: framing.HEADER_SIZE])
    assert bytes(mem) == before


def test_client_with_secret_against_open_server_fails_clearly() -> None:
    with TransferEngine(None, protocol="tcp", config=CFG, auth=auth.DISABLED) as open_:
        open_.register_memory("open/seg", bytearray(4096))
        info = open_.segment_info("open/seg")
        quick = auth.Authenticator(SECRET, handshake_timeout_s=0.3)
        with TransferEngine(None, protocol="tcp", config=CFG, auth=quick) as e:
            e.registry._cache["open/seg"] = info  # type: ignore[attr-defined]
            with pytest.raises(AuthFailed, match="no authentication challenge"):
                e.write("open/seg", 0, b"x")


def test_non_loopback_bind_needs_a_secret() -> None:
    with pytest.raises(auth.InsecureBind, match="not loopback"):
        TransferEngine(None, listen_hosts=("0.0.0.0",), auth=auth.DISABLED)
    with pytest.raises(auth.InsecureBind):
        DirectoryService("10.11.12.13", 0, auth=None).start()
    auth.check_bind("127.0.0.5", None, "x")  # loopback is fine without one
    auth.check_bind("10.11.12.13", GOOD, "x")


def test_config_sources(tmp_path: Path) -> None:
    f = tmp_path / "secret"
    f.write_text(SECRET.decode() + "\n")
    a = auth.load_auth(env={"KVCAKE_AUTH_SECRET_FILE": str(f)})
    assert a is not None and a.verify(b"n" * 32, "x", GOOD.mac(b"n" * 32, "x"))
    assert auth.load_auth(env={}) is None
    env_only = auth.load_auth(env={"KVCAKE_AUTH_SECRET": SECRET.decode()})
    assert env_only is not None and not env_only.verify(b"n" * 32, "y", GOOD.mac(b"n" * 32, "x"))
    toml = tmp_path / "c.toml"
    toml.write_text(f'[auth]\nsecret_file = "{f}"\n')
    assert auth.load_auth(toml, env={}) is not None
    with pytest.raises(ConfigError, match="at least 16"):
        auth.load_auth(env={"KVCAKE_AUTH_SECRET": "short"})
    with pytest.raises(ConfigError, match="exclude"):
        auth.load_auth(
            env={"KVCAKE_AUTH_SECRET": SECRET.decode(), "KVCAKE_AUTH_SECRET_FILE": str(f)}
        )
    with pytest.raises(ConfigError, match="does-not-exist"):
        auth.load_auth(overrides={"secret_file": str(tmp_path / "does-not-exist")}, env={})
    assert "correct" not in repr(a)


def test_silent_peers_cannot_pile_up(secured: tuple, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[type-arg]
    """Connections that never answer the challenge are bounded (MAX_HANDSHAKES); once they
    time out, authenticated peers are served again."""
    from kvcake.net import netserver

    _svc, target, _mem = secured
    monkeypatch.setattr(netserver, "MAX_HANDSHAKES", 4)
    quick = auth.Authenticator(SECRET, handshake_timeout_s=0.5)
    monkeypatch.setattr(target.server, "auth", quick)
    silent = [connect(target) for _ in range(4)]
    time.sleep(0.1)
    with connect(target) as extra:  # the fifth: dropped at once, not challenged
        assert read_all(extra) == b""
    for s in silent:
        s.close()
    time.sleep(0.6)
    assert probe(target.addresses[0], 2.0, quick)
