"""The master as a real process: malformed input never crashes it; HTTP endpoints answer."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from collections.abc import Iterator

import msgspec
import pytest

from kvcake.core import framing
from kvcake.store import protocol as P
from kvcake.store.errors import (
    INVALID_PARAMS,
    NO_AVAILABLE_HANDLE,
    OBJECT_NOT_FOUND,
    InvalidParams,
    SegmentNotFound,
)
from kvcake.store.rpc import MasterConnection
from tests.store.procs import Proc, spawn
from tests.waits import wait_until


@pytest.fixture(scope="module")
def master_proc() -> Iterator[Proc]:
    """One master for this module (every test leaves it in a state the others tolerate)."""
    proc = spawn("master", "--port", "0", "--http-port", "0", "--client-ttl-s", "1", ready="master")
    yield proc
    proc.stop()


def _raw(addr: str, payload: bytes) -> bytes:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        out = b""
        try:  # the master may answer and close before we finish sending
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):
                out += chunk
        except OSError:
            pass
        return out


def _alive(addr: str) -> None:
    conn = MasterConnection(addr, timeout_s=5)
    reply = conn.call(P.Heartbeat("probe", "127.0.0.1"))
    assert reply.client_ttl_ms == 1000
    conn.close()


def test_malformed_frames_never_crash_master(master_proc: Proc) -> None:
    addr = master_proc.info["rpc"]
    bad_msg = b"\x93\x01\x02\x03"  # msgpack that is no request
    header = framing.pack_header
    cases = [
        b"garbage that is not a frame at all........",
        b"KC\x09\x00" + b"\x00" * 20,  # wrong version
        header(1, 1 << 30),  # meta larger than the limit
        header(1, 4, data_len=10),  # requests carry no data section
        header(1, len(bad_msg)) + bad_msg,
        header(1, 100) + b"short",  # truncated
        header(1, 3) + msgspec.msgpack.encode({"type": "Nope"})[:3],
        bytes(range(256)) * 10,
    ]
    for payload in cases:
        out = _raw(addr, payload)
        if out:  # when the master could answer, it is a typed error reply
            frame = framing.FrameDecoder(P.REPLY_CODEC).feed(out)[0]
            assert isinstance(frame.msg, P.ErrorReply) and frame.msg.code == INVALID_PARAMS
        _alive(addr)
    assert master_proc.popen.poll() is None


def test_bad_requests_get_typed_errors(master_proc: Proc) -> None:
    conn = MasterConnection(master_proc.info["rpc"], timeout_s=5)
    r = conn.call(P.PutStart("nobody-knows-me", "h", ["", "k", "big"], [10, -5, 1 << 63]))
    codes = [x.code for x in r.results]
    assert codes == [INVALID_PARAMS, INVALID_PARAMS, NO_AVAILABLE_HANDLE]
    with pytest.raises(InvalidParams):
        conn.call(P.PutStart("c", "h", ["a", "b"], [1]))
    with pytest.raises(InvalidParams):
        conn.call(P.Mount("c", "h", "seg", 0))
    with pytest.raises(InvalidParams):
        conn.call(P.Mount("c", "h", "seg", 100, tier="tape"))
    with pytest.raises(InvalidParams):
        conn.call(P.RemoveAll("c", regex="(["))
    with pytest.raises(InvalidParams):
        conn.call(P.RemoveAll("c", pattern="x*" * 600))
    r = conn.call(P.GetReplicas("c", ["missing", ""]))
    assert [x.code for x in r.results] == [OBJECT_NOT_FOUND, INVALID_PARAMS]
    r = conn.call(P.TaskDone("c", "offload", "never-existed", True))  # unknown task: harmless
    with pytest.raises(SegmentNotFound):
        conn.call(P.Unmount("c", "x"))
    # a dead-predecessor report about garbage, the reporter itself, or an owner nobody knows
    for owner in ("garbage", "", "h/1/x" * 1000, "c"):
        with pytest.raises(InvalidParams, match="not known to have run"):
            conn.call(P.OwnerGone("c", "host-id", owner))
    conn.close()
    _alive(master_proc.info["rpc"])


def test_http_endpoints(master_proc: Proc) -> None:
    conn = MasterConnection(master_proc.info["rpc"], timeout_s=5)
    conn.call(P.Mount("node", "127.0.0.1", "seg-a", 1 << 20))
    r = conn.call(P.PutStart("w", "127.0.0.1", ["key/1"], [1000]))
    assert r.results[0].code == 0
    conn.call(P.PutEnd("w", ["key/1"]))
    base = f"http://{master_proc.info['http']}"

    def get(path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(base + path, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    assert json.loads(get("/health")[1]) == {"status": "ok", "segments": 1}
    assert json.loads(get("/get_all_keys")[1]) == ["key/1"]
    (seg,) = json.loads(get("/get_all_segments")[1])
    assert seg["name"] == "seg-a" and seg["used"] == 1024 and seg["capacity"] == 1 << 20
    status, body = get("/query_key?key=key/1")
    assert status == 200 and json.loads(body)["replicas"][0]["segment"] == "seg-a"
    assert get("/query_key?key=nope")[0] == 404
    assert get("/query_key")[0] == 400
    assert get("/nowhere")[0] == 404
    metrics = get("/metrics")[1].decode()
    assert 'kvcake_store_segment_used_bytes{segment="seg-a",tier="memory"} 1024.0' in metrics
    assert re.search(r"kvcake_store_master_requests_total{op=\"PutStart\"} [1-9]", metrics)
    assert "kvcake_store_master_request_seconds_bucket" in metrics
    assert re.search(r"kvcake_store_dedup_sessions [1-9]", metrics)  # conn's mutating calls
    conn.close()


def test_mooncake_http_metadata_protocol(master_proc: Proc) -> None:
    """GET/PUT/DELETE /metadata?key= as mooncake_http_metadata_server answers them, plus the
    read-only kvcake/segments/ view of the directory; bad input gets 4xx, never a crash."""
    import httpx

    url = f"http://{master_proc.info['http']}/metadata"
    with httpx.Client(timeout=5) as h:
        assert h.get(url, params={"key": "mooncake/ram/x"}).status_code == 404
        body = b'{"name": "x", "buffers": []}'
        r = h.put(url, params={"key": "mooncake/ram/x"}, content=body)
        assert (r.status_code, r.text) == (200, "metadata updated")
        r = h.get(url, params={"key": "mooncake/ram/x"})
        assert r.status_code == 200 and r.content == body
        assert r.headers["content-type"] == "application/json; charset=utf-8"
        assert h.delete(url, params={"key": "mooncake/ram/x"}).text == "metadata deleted"
        assert h.delete(url, params={"key": "never-there"}).status_code == 200
        assert h.get(url, params={"key": "mooncake/ram/x"}).status_code == 404
        assert h.get(url).status_code == 400  # no key
        assert h.put(url, params={"key": "k"}, content=b"x" * (2 << 20)).status_code == 413
        assert h.put(url, params={"key": "kvcake/segments/a"}, content=b"1").status_code == 403
        assert h.get(url, params={"key": "kvcake/segments/"}).status_code == 200
        assert h.get(url, params={"key": "kvcake/segments/nope"}).status_code == 404


def test_connection_and_request_caps() -> None:
    """Over master.max_connections a client gets a clear error (the master keeps serving the
    others); a request over master.max_request_bytes is refused with the limit named."""
    proc = spawn(
        "master", "--port", "0", "--http-port", "-1", "--max-connections", "2",
        "--max-request-bytes", "64KiB", ready="master",
    )  # fmt: skip
    try:
        rpc = proc.info["rpc"]
        a, b, c = (MasterConnection(rpc, timeout_s=5, retries=0) for _ in range(3))
        a.call(P.Heartbeat("a", "h"))
        b.call(P.Heartbeat("b", "h"))
        with pytest.raises(InvalidParams, match="max_connections"):
            c.call(P.Heartbeat("c", "h"))
        keys = [f"key-{i:06d}" for i in range(8000)]
        with pytest.raises(InvalidParams, match="max_request_bytes"):
            a.call(P.PutStart("a", "h", keys, [1] * len(keys)))
        b.call(P.Heartbeat("b", "h"))  # still serving
        b.close()
        d = MasterConnection(rpc, timeout_s=5, retries=0)
        # b's slot frees once the master sees its EOF
        wait_until(lambda: d.call(P.Heartbeat("d", "h")) or True, timeout=10,
                   ignore=(InvalidParams,), what="a closed connection's slot freed")  # fmt: skip
        for conn in (a, c, d):
            conn.close()
    finally:
        proc.stop()


def test_meanwhile_runs_once_between_send_and_reply_and_a_failure_closes_the_link(
    master_proc: Proc,
) -> None:
    """``MasterConnection.call(meanwhile=...)``: a put sums its small values while its PutStart
    is at the master; the work runs once, after the request left; if it raises, the link (a
    reply still on its way) is closed so the next call cannot read that stale reply."""
    conn = MasterConnection(master_proc.info["rpc"], timeout_s=5)
    seen: list[bool] = []

    def work() -> None:
        assert conn._sock is not None  # connected: the request went out first
        seen.append(True)

    r = conn.call(P.GetReplicas("c", ["missing"]), meanwhile=work)
    assert seen == [True] and r.results[0].code == OBJECT_NOT_FOUND

    def boom() -> None:
        raise RuntimeError("meanwhile failed")

    with pytest.raises(RuntimeError, match="meanwhile failed"):
        conn.call(P.GetReplicas("c", ["a"]), meanwhile=boom)
    assert conn._sock is None  # closed: the GetReplicas reply was never read
    r = conn.call(P.GetReplicas("c", ["missing", ""]))  # a fresh link, the right reply
    assert [x.code for x in r.results] == [OBJECT_NOT_FOUND, INVALID_PARAMS]
    conn.close()
