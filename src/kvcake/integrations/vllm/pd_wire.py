"""What crosses between a prefill and a decode engine on the direct (Transfer Engine) P/D path.

- ``kv_transfer_params``: the prefill's answer names its vLLM engine id (its KV segments are
  named after it), its request id, the block ids holding the prompt's KV, its block count and
  the address of its release inbox; the decode sends them back with its request
  (:func:`producer_params` / :func:`parse_remote`).
- KV segments: one Transfer Engine segment per KV plane of each worker
  (:func:`segment_name`), published in the kvcake master's directory.
- Release notes: after its reads ended the decode tells the prefill "done with request R"
  (:class:`Release`, msgspec over a zmq PUSH -> PULL pair on 127.0.0.1), so the prefill frees
  the blocks it kept (else they are freed when the lease ends).

Pure except for :class:`Inbox` / :class:`Notifier` (zmq sockets); no vLLM imports.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from kvcake.core.auth import Authenticator, resolve
from kvcake.core.errors import KvcakeError

TRANSPORT_KEY = "kvcake_transport"
MAX_PARAM_BLOCKS = 1 << 20  # a prompt never has more blocks than this; bounds parsing


class PdParamsError(KvcakeError):
    """A decode request's ``kv_transfer_params`` name a Transfer Engine source badly."""


def segment_name(engine_id: str, rank: int, plane: int) -> str:
    """The Transfer Engine segment of KV plane ``plane`` of worker ``rank`` of an engine."""
    return f"vllmkv-{engine_id}-tp{rank}-p{plane}"


@dataclass(frozen=True)
class RemoteKv:
    """Where a decode request's prompt KV lives on its prefill engine."""

    engine_id: str
    request_id: str
    block_ids: tuple[int, ...]
    num_blocks: int  # the prefill engine's KV blocks per plane (its segments' size check)
    notify: str  # tcp://127.0.0.1:PORT of the prefill's release inbox


def producer_params(
    engine_id: str, request_id: str, block_ids: list[int], num_blocks: int, notify: str
) -> dict[str, Any]:
    """The prefill's ``kv_transfer_params`` (vLLM's key names where vLLM has one)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        TRANSPORT_KEY: "te",
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_block_ids": list(block_ids),
        "kvcake_num_blocks": num_blocks,
        "kvcake_notify": notify,
    }


def is_te_decode(params: dict[str, Any] | None) -> bool:
    return bool(params and params.get("do_remote_prefill") and params.get(TRANSPORT_KEY) == "te")


def parse_remote(params: dict[str, Any]) -> RemoteKv:
    """Validate a decode request's te params; raises PdParamsError saying what is wrong."""

    def text(key: str) -> str:
        v = params.get(key)
        if not isinstance(v, str) or not v or len(v) > 256:
            raise PdParamsError(f"kv_transfer_params.{key} must be a non-empty string")
        return v

    num_blocks = params.get("kvcake_num_blocks")
    if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks <= 0:
        raise PdParamsError("kv_transfer_params.kvcake_num_blocks must be a positive integer")
    ids = params.get("remote_block_ids")
    if not isinstance(ids, list) or len(ids) > MAX_PARAM_BLOCKS:
        raise PdParamsError("kv_transfer_params.remote_block_ids must be a list of block ids")
    if ids and isinstance(ids[0], list):  # vLLM's per-group form: one group here
        if len(ids) != 1:
            raise PdParamsError("remote_block_ids: only one KV cache group is supported")
        ids = ids[0]
    if not all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b < num_blocks for b in ids):
        raise PdParamsError(f"remote_block_ids must be integers in [0, {num_blocks})")
    notify = text("kvcake_notify")
    if not notify.startswith("tcp://127.0.0.1:"):
        raise PdParamsError("kvcake_notify must be a tcp://127.0.0.1:PORT address")
    return RemoteKv(text("remote_engine_id"), text("remote_request_id"), tuple(ids),
                    num_blocks, notify)  # fmt: skip


class Release(msgspec.Struct, frozen=True):
    """decode -> prefill: the decode's reads of these requests' blocks have ended. ``mac``:
    HMAC-SHA256 of the ids under the cluster's shared secret (empty without one)."""

    request_ids: list[str]
    mac: bytes = b""


_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(Release)
_MAC_CONTEXT = "kvcake-pd-release"


def _signed(ids: list[str]) -> bytes:
    return "\n".join(ids).encode()


def encode_release(request_ids: list[str], auth: Authenticator | None = None) -> bytes:
    mac = auth.mac(_signed(request_ids), _MAC_CONTEXT) if auth is not None else b""
    return _ENC.encode(Release(request_ids, mac))


def decode_release(data: bytes, auth: Authenticator | None = None) -> list[str]:
    """Request ids of one release note; raises PdParamsError on a malformed one, or, when
    the cluster has a shared secret, on a note without its valid MAC (a release note frees
    blocks early: only the cluster's own processes may send one). A replayed note is harmless:
    releasing released ids does nothing."""
    try:
        note = _DEC.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise PdParamsError(f"malformed release note: {exc}") from exc
    if auth is not None and not auth.verify(_signed(note.request_ids), _MAC_CONTEXT, note.mac):
        raise PdParamsError("release note without a valid MAC (wrong or missing secret)")
    return [r for r in note.request_ids if len(r) <= 256]


class Inbox:
    """The prefill scheduler's PULL socket for release notes (bound on loopback, polled)."""

    def __init__(
        self, log: logging.Logger, max_queued: int = 4096, auth: Authenticator | None = None
    ):
        self._zmq = zmq
        self.log = log
        self.auth = resolve(auth)  # the environment's shared secret unless given
        self._ctx: Any = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, max_queued)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, 1 << 20)
        self._sock.bind("tcp://127.0.0.1:*")
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._bad = 0

    def drain(self, max_notes: int = 1024) -> set[str]:
        """Request ids released since the last call (never blocks; malformed notes dropped)."""
        done: set[str] = set()
        for _ in range(max_notes):
            try:
                data = self._sock.recv(self._zmq.NOBLOCK)
            except self._zmq.Again:
                break
            try:
                done.update(decode_release(data, self.auth))
            except PdParamsError as exc:
                self._bad += 1
                if self._bad == 1 or self._bad % 1000 == 0:
                    self.log.warning("kvcake: %s (%d so far, ignored)", exc, self._bad)
        return done

    def close(self) -> None:
        self._sock.close(0)


class Notifier:
    """PUSH sockets to prefill inboxes, at most ``max_peers`` (least recently used closed).

    Sends never block: a note to a vanished prefill is dropped once its queue (``hwm``) is
    full, and the prefill frees its blocks at the lease's end instead."""

    def __init__(self, max_peers: int = 32, hwm: int = 256, auth: Authenticator | None = None):
        self._zmq = zmq
        self.auth = resolve(auth)
        self._ctx: Any = zmq.Context.instance()
        self._peers: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self.max_peers = max_peers
        self.hwm = hwm
        self.linger_ms = 1000  # a closed peer's queued notes get this long to go out

    def send(self, address: str, request_ids: list[str]) -> bool:
        zmq = self._zmq
        sock = self._peers.pop(address, None)
        if sock is None:
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, self.hwm)
            sock.connect(address)
        self._peers[address] = sock
        while len(self._peers) > self.max_peers:
            _, old = self._peers.popitem(last=False)
            old.close(self.linger_ms)  # zmq delivers what is queued in the background
        try:
            sock.send(encode_release(request_ids, self.auth), zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def close(self) -> None:
        for sock in self._peers.values():
            with contextlib.suppress(Exception):
                sock.close(self.linger_ms)
        self._peers.clear()
