"""Signed HTTP requests that cannot be replayed (issue 32): the ``x-kvcake-auth`` header.

The MAC (HMAC-SHA256 with the cluster's shared secret, :meth:`Authenticator.mac_of`) covers
the whole request and where it is going::

    "kvcake-http-2" \\n service \\n host:port \\n t \\n nonce \\n METHOD \\n target \\n sha256(body)

``target`` is the raw request target (path and query, as sent on the wire); the body digest
is taken over the exact bytes sent (the empty body included: ``sha256(b"")``; a streamed body
is read in full before signing). ``service`` and ``host:port`` are the **audience**: the
server checks the service is its own and that ``host:port`` names the address the request
reached (the connection's local address, a name that resolves to it, or one of
``[auth] http_names``), so a header captured at one server is refused by every other server
sharing the secret. Header::

    x-kvcake-auth: v=2,t=<unix s>,n=<32 hex nonce>,aud=<service>@<host:port>,b=<sha256 hex>,mac=<hex>

A server accepts a header when ``now - window_s <= t <= now + max_skew_s`` and its nonce was
not seen before; nonces are remembered until the header expires (``window_s + max_skew_s``
after it was admitted). The cache holds at most ``nonces`` live entries: when it is full, new
requests are refused (503) and no live nonce is ever evicted, so memory stays bounded and a
replay can never slip in through an eviction.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvcake.core.config import require, size_field
from kvcake.core.errors import KvcakeError

if TYPE_CHECKING:
    from kvcake.core.auth import Authenticator

HEADER = "x-kvcake-auth"
VERSION = "2"
DOMAIN = "kvcake-http-2"
EMPTY_BODY = hashlib.sha256(b"").hexdigest()
MAX_WINDOW_S = 30.0
WILDCARD = frozenset({"0.0.0.0", "::"})  # what a wildcard-bound server announces

# Services (the audience's first half): each HTTP server checks its own name.
MASTER_HTTP = "master-http"
NODE_HTTP = "node-http"
INSTANCE_HTTP = "instance-http"


class HttpRefused(KvcakeError):
    """A request the server refuses: ``status`` 401 (bad or replayed credentials), 413 (body
    beyond ``max_body``) or 503 (the nonce cache is full: retry later)."""

    def __init__(self, reason: str, status: int = 401):
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True)
class HttpPolicy:
    """The server side's limits (``[auth] http_*``)."""

    window_s: float = MAX_WINDOW_S  # a header is valid this long after its time t
    max_skew_s: float = 5.0  # and from this long before t (a client clock ahead of ours)
    nonces: int = 131_072  # live nonces remembered per server; beyond, requests are refused
    max_body: int = size_field("64MiB")  # a signed body is read in full before the app sees it
    names: tuple[str, ...] = ()  # extra "host" or "host:port" this process is reached by (NAT)

    def __post_init__(self) -> None:
        require(0 < self.window_s <= MAX_WINDOW_S, "auth.http_window_s must be in (0, 30]")
        require(
            0 <= self.max_skew_s <= self.window_s,
            "auth.http_max_skew_s must be in [0, auth.http_window_s]",
        )
        require(self.nonces >= 16, "auth.http_nonces must be >= 16")
        require(self.max_body >= 0, "auth.http_max_body must be >= 0")


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest() if body else EMPTY_BODY


def _message(
    service: str, authority: str, t: str, nonce: str, method: str, target: bytes, digest: str
) -> bytes:
    head = "\n".join((DOMAIN, service, authority, t, nonce, method.upper(), ""))
    return head.encode() + target + b"\n" + digest.encode()


def sign(
    auth: Authenticator,
    service: str,
    authority: str,
    method: str,
    target: bytes,
    body: bytes = b"",
    now: float | None = None,
) -> dict[str, str]:
    """The header for one request to ``service`` at ``authority`` (``host:port``)."""
    t = str(int(time.time() if now is None else now))
    nonce = os.urandom(16).hex()
    digest = body_digest(body)
    mac = auth.mac_of(_message(service, authority, t, nonce, method, target, digest)).hex()
    value = f"v={VERSION},t={t},n={nonce},aud={service}@{authority},b={digest},mac={mac}"
    return {HEADER: value}


@dataclass(frozen=True)
class Claim:
    """A header whose MAC is valid for its claimed body digest and audience."""

    host: str
    port: int
    nonce: str
    digest: str
    admitted_at: float


class NonceCache:
    """Nonces seen, each until its expiry. Entries expire in insertion order (every entry
    lives the same time from admission), so a FIFO purge keeps it exact and O(1)."""

    def __init__(self, capacity: int, ttl_s: float):
        self.capacity, self.ttl_s = capacity, ttl_s
        self._seen: dict[str, float] = {}
        self._order: deque[tuple[float, str]] = deque()
        self._lock = threading.Lock()
        self.refused_full = 0
        self.replays = 0

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, nonce: str, now: float) -> None:
        with self._lock:
            while self._order and self._order[0][0] < now:
                self._seen.pop(self._order.popleft()[1], None)
            if nonce in self._seen:
                self.replays += 1
                raise HttpRefused("unauthorized: this request was already seen (a replay)")
            if len(self._seen) >= self.capacity:
                self.refused_full += 1
                raise HttpRefused(
                    f"too many signed requests: {self.capacity} nonces are live "
                    "(auth.http_nonces); retry later",
                    503,
                )
            expiry = now + self.ttl_s
            self._seen[nonce] = expiry
            self._order.append((expiry, nonce))


def _fields(value: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in value.split(",") if "=" in p)


def _number(text: str, digits: int) -> bool:
    """ASCII digits only, and few: ``int()`` of a 5,000-digit string raises, never a 500."""
    return 0 < len(text) <= digits and text.isascii() and text.isdigit()


def _split(name: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 address."""
    head, sep, port = name.rpartition(":")
    if sep and port.isdigit() and (name.count(":") == 1 or head.endswith("]")):
        return head, int(port)
    return name, None


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _canon(host: str) -> str:
    try:
        return ipaddress.ip_address(host.strip("[]")).compressed
    except ValueError:
        return host.lower()


class HttpVerifier:
    """One server's side: ``check_header`` (time, service, MAC over the claimed digest: no
    body is read for a request without valid credentials), ``check_body``,
    ``check_audience``, then ``admit`` (the nonce, last: a refused request burns none)."""

    def __init__(self, auth: Authenticator, service: str, policy: HttpPolicy | None = None):
        self.auth, self.service = auth, service
        self.policy = policy or auth.http_policy
        # +1 s: the signed time is whole seconds, the clock is not.
        ttl = self.policy.window_s + self.policy.max_skew_s + 1.0
        self.nonces = NonceCache(self.policy.nonces, ttl)
        self._resolved: dict[str, tuple[float, frozenset[str]]] = {}  # name -> (until, addrs)

    def check_header(
        self, headers: Mapping[str, str], method: str, target: bytes, now: float | None = None
    ) -> Claim:
        now = time.time() if now is None else now
        f = _fields(headers.get(HEADER, ""))
        t, nonce, aud, digest = f.get("t", ""), f.get("n", ""), f.get("aud", ""), f.get("b", "")
        if f.get("v") != VERSION or not _number(t, 12) or len(nonce) != 32 or "@" not in aud:
            raise HttpRefused(f"unauthorized: no valid {HEADER} (v={VERSION}) header")
        if not now - self.policy.window_s <= int(t) <= now + self.policy.max_skew_s:
            raise HttpRefused(
                f"unauthorized: the signed time is outside [now - {self.policy.window_s:g} s, "
                f"now + {self.policy.max_skew_s:g} s] (a replay, or clocks too far apart)"
            )
        service, _, authority = aud.partition("@")
        host, _, port = authority.rpartition(":")
        if service != self.service or not host or not _number(port, 5):
            raise HttpRefused(f"unauthorized: signed for {aud!r}, this is {self.service!r}")
        want = self.auth.mac_of(_message(service, authority, t, nonce, method, target, digest))
        if not hmac.compare_digest(want.hex().encode(), f.get("mac", "").encode()):
            raise HttpRefused("unauthorized: bad signature (wrong secret, or a changed request)")
        return Claim(host.strip("[]"), int(port), nonce, digest, now)

    def check_body(self, claim: Claim, body: bytes) -> None:
        if not hmac.compare_digest(body_digest(body), claim.digest):
            raise HttpRefused("unauthorized: the body is not the signed body")

    async def check_audience(self, claim: Claim, local: tuple[str, int] | None) -> None:
        """``host:port`` must name where the request arrived (``local``: the connection's
        local address), or be listed in ``names``."""
        host = _canon(claim.host)
        for name in self.policy.names:
            n_host, n_port = _split(name)
            if _canon(n_host) == host and n_port in (None, claim.port):
                return
        if local is not None and claim.port == local[1]:
            here = _canon(local[0])
            if host in WILDCARD:  # a connect to 0.0.0.0 / :: reaches this host's loopback
                if _is_loopback(here):
                    return
            elif host == here or here in await self._addresses(claim.host):
                return
        raise HttpRefused(f"unauthorized: signed for another server ({claim.host}:{claim.port})")

    async def _addresses(self, name: str) -> frozenset[str]:
        """What ``name`` resolves to, cached 30 s (at most 256 names: credentials were already
        checked, so only holders of the secret can make the server resolve)."""
        now = time.monotonic()
        hit = self._resolved.get(name)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(name, None)
            addrs = frozenset(_canon(str(i[4][0])) for i in infos)
        except OSError:
            addrs = frozenset()
        if len(self._resolved) >= 256:
            self._resolved.clear()
        self._resolved[name] = (now + 30.0, addrs)
        return addrs

    def admit(self, claim: Claim) -> None:
        self.nonces.admit(claim.nonce, claim.admitted_at)
