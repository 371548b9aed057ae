"""The ``metadata_server`` argument of ``setup`` / ``TransferEngine.initialize``.

kvcake has one metadata service, the master's directory, so the argument only selects how a
Mooncake deployment *named* its metadata; it is still validated as Mooncake does: an unknown form
or an unreachable server is an error (the wheel aborts the process on an unknown scheme; kvcake
returns -600 instead). ``P2PHANDSHAKE`` needs no server; ``http://host:port/metadata`` (the
master's ``--enable_http_metadata_server`` endpoint, which kvcake's master also serves) must
answer HTTP; ``etcd://host:port[,host:port]`` must accept a TCP connection."""

from __future__ import annotations

import logging
import socket
from urllib.parse import urlparse

import httpx

from kvcake.store import errors as E

log = logging.getLogger(__name__)
TIMEOUT_S = 3.0


def _tcp_ok(hostport: str) -> bool:
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False


def check_metadata_server(spec: str) -> int:
    """0 if ``spec`` names a usable metadata server, else Mooncake's error code."""
    if spec in ("P2PHANDSHAKE", "p2phandshake"):
        return 0
    if spec.startswith(("http://", "https://")):
        url = urlparse(spec)
        if not url.hostname or not url.port:
            log.error("metadata server %r: need http://host:port/path", spec)
            return E.INVALID_PARAMS
        try:
            httpx.get(spec, params={"key": "__kvcake_probe__"}, timeout=TIMEOUT_S)
        except httpx.HTTPError as exc:
            log.error("metadata server %s unreachable: %s", spec, exc)
            return E.INTERNAL_ERROR
        return 0
    if spec.startswith("etcd://"):
        endpoints = spec[len("etcd://") :].split("/", 1)[0].replace(";", ",").split(",")
        if any(_tcp_ok(e) for e in endpoints if e):
            return 0
        log.error("metadata server %s: no etcd endpoint reachable", spec)
        return E.INTERNAL_ERROR
    log.error("metadata server %r: use P2PHANDSHAKE, http://host:port/metadata or etcd://", spec)
    return E.INVALID_PARAMS
