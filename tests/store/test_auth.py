"""Shared-secret authentication of the store (issue 15 §3): the master RPC, the directory, the
storage node's Transfer Engine and both HTTP servers. Without the secret (or with a wrong one)
nothing is read or written and the client gets a typed error; a valid frame sent without the
secret is never interpreted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvcake.core import auth, framing
from kvcake.core.http_auth import MASTER_HTTP, NODE_HTTP
from kvcake.store import protocol as P
from kvcake.store.client import Client
from kvcake.store.config import MasterConfig, StoreServerConfig
from kvcake.store.errors import Unauthorized
from kvcake.store.master_server import Master
from kvcake.store.server import StoreServer
from kvcake.transfer.protocol import CODEC as TE_CODEC
from kvcake.transfer.protocol import WriteReq
from tests.rawsock import raw, read_all
from tests.store.procs import spawn
from tests.waits import wait_until

SECRET = b"store-auth-test-secret-0123456789"
GOOD = auth.Authenticator(SECRET, handshake_timeout_s=2.0)
WRONG = auth.Authenticator(b"someone-elses-secret-987654321", handshake_timeout_s=2.0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Master, StoreServer]]:
    m = Master(MasterConfig(port=0, http_port=0, client_ttl_s=2), auth=GOOD)
    m.start()
    node = StoreServer(
        StoreServerConfig(master=m.rpc_address, segment_size=8 << 20, http_port=0), auth=GOOD
    )
    node.start()
    yield m, node
    node.stop()
    m.stop()


def test_with_the_secret_everything_works(cluster: tuple[Master, StoreServer]) -> None:
    m, _node = cluster
    with Client(master=m.rpc_address, protocol="tcp", auth=GOOD) as c:
        c.put("auth/ok", b"v" * 10_000)
        assert bytes(c.get("auth/ok")) == b"v" * 10_000
        c.remove("auth/ok", force=True)
    assert m.rpc.auth_refused == 0


@pytest.mark.parametrize("key", [auth.DISABLED, WRONG], ids=["none", "wrong"])
def test_master_refuses_clients_without_the_secret(
    cluster: tuple[Master, StoreServer], key: auth.Authenticator
) -> None:
    m, _node = cluster
    refused = m.rpc.auth_refused
    with pytest.raises(Unauthorized, match="secret|authentication"):
        Client(master=m.rpc_address, auth=key)
    # the server thread counts after the client saw the refusal
    wait_until(lambda: m.rpc.auth_refused > refused, timeout=5, every_s=0.01,
               what="the refusal counted")  # fmt: skip
    assert m.rpc.auth_refused > refused


def test_valid_frames_without_secret_change_nothing(cluster: tuple[Master, StoreServer]) -> None:
    m, _node = cluster
    with Client(master=m.rpc_address, protocol="tcp", auth=GOOD) as c:
        c.put("auth/victim", b"A" * 4096)
        reply = c.conn.call(P.GetReplicas(c.id, ["auth/victim"]))
        rep = reply.results[0].replicas[0]
        seg_info = c.engine.segment_info(rep.segment)
        before = len(m.state.readable_keys())
        # A put and a remove, well-formed, on the master's RPC: never interpreted.
        for msg in (
            P.PutStart("intruder", "127.0.0.1", ["auth/intruder"], [4096], P.PutOptions()),
            P.Remove("intruder", ["auth/victim"], True),
        ):
            with raw(m.rpc_address) as s:
                s.sendall(framing.pack_frame(P.REQUEST_CODEC, 1, msg))
                got = read_all(s)
            assert got.startswith(auth.CHALLENGE) and b"requires authentication" in got
        assert len(m.state.readable_keys()) == before
        # A write straight into the storage node's segment, over its transfer server.
        with raw(seg_info.paths[0].address) as s:
            frame = framing.pack_frame(TE_CODEC, 1, WriteReq(rep.segment, rep.offset), b"Z" * 4096)
            s.sendall(frame)
            got = read_all(s)
        assert got.startswith(auth.CHALLENGE)
        assert bytes(c.get("auth/victim")) == b"A" * 4096
        c.remove("auth/victim", force=True)


def test_http_needs_the_secret(cluster: tuple[Master, StoreServer]) -> None:
    m, node = cluster
    for base in (f"http://{m.http_address}", f"http://{node.http_address}"):
        assert httpx.get(f"{base}/health").status_code in (200, 503)  # liveness stays open
        r = httpx.get(f"{base}/metrics")
        assert r.status_code == 401 and "unauthorized" in r.json()["error"]
        bad = httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer wrong-secret-xx"})
        assert bad.status_code == 401
        ok = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {SECRET.decode()}"})
        assert ok.status_code == 200
        service = MASTER_HTTP if base.endswith(m.http_address) else NODE_HTTP
        signed = GOOD.http_headers("GET", f"{base}/metrics", service)
        assert httpx.get(f"{base}/metrics", headers=signed).status_code == 200
    url = f"http://{m.http_address}/get_all_keys"
    assert httpx.get(url, headers=WRONG.http_headers("GET", url, MASTER_HTTP)).status_code == 401


def test_non_loopback_master_needs_a_secret() -> None:
    with pytest.raises(auth.InsecureBind, match="0.0.0.0"):
        Master(MasterConfig(host="0.0.0.0", port=0, http_port=-1), auth=auth.DISABLED).start()


def test_cli_flag_and_refusal(tmp_path: Path) -> None:
    """`kvcake master --auth-secret-file` on loopback; `--host 0.0.0.0` without one exits 2."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "kvcake", "master", "--host", "0.0.0.0", "--port", "0",
         "--http-port", "-1"],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert r.returncode == 2 and "not loopback" in r.stderr and "--auth-secret-file" in r.stderr
    f = tmp_path / "secret"
    f.write_bytes(SECRET + b"\n")
    p = spawn("master", "--port", "0", "--http-port", "-1", "--auth-secret-file", str(f),
              ready="master")  # fmt: skip
    try:
        with pytest.raises(Unauthorized):
            Client(master=p.info["rpc"], auth=auth.DISABLED)
        # A pure client (no segment) with the secret is served.
        with Client(master=p.info["rpc"], auth=GOOD) as c:
            assert not c.is_exist("nothing")
    finally:
        p.stop()


def test_disk_service_needs_the_secret(tmp_path: Path) -> None:
    """A storage node's SSD tier is read over its disk service: authenticated like the rest."""
    from kvcake.core.integrity import checksums
    from kvcake.store.disk import REQ, DiskRead, DiskService, DiskTier, read_remote

    tier = DiskTier(tmp_path)
    secret_bytes = b"S" * 3000 + b"ecret payload"
    tier.write("k", memoryview(secret_bytes), checksums("k", secret_bytes))
    svc = DiskService(tier, "127.0.0.1", auth=GOOD)
    svc.start()
    try:
        out = bytearray(len(secret_bytes))
        read_remote(svc.addresses[0], "k", memoryview(out), GOOD)
        assert bytes(out) == secret_bytes
        for key in (None, WRONG):
            with pytest.raises(Unauthorized):
                read_remote(svc.addresses[0], "k", memoryview(bytearray(len(out))), key)
        with raw(svc.addresses[0]) as s:
            s.sendall(framing.pack_frame(REQ, 1, DiskRead("k", len(out))))
            got = read_all(s)
        assert got.startswith(auth.CHALLENGE) and b"ecret payload" not in got
    finally:
        svc.stop()
