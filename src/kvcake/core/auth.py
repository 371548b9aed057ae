"""Shared-secret authentication of kvcake's own connections (master RPC, Transfer Engine,
directory, disk service, admin HTTP).

Per connection, before any frame: the server sends a challenge (a fresh 32-byte nonce), the
client answers ``HMAC-SHA256(secret, nonce || context)`` where ``context`` names the service,
the server compares in constant time and says OK or refuses (with a reason) and closes. After
that the connection carries plain kvcake frames: nothing is encrypted, so the data path keeps
its speed, and the cost is one round trip per connection, never per frame.

Wire (all sizes fixed)::

    challenge  "KC" A5 01 | nonce[32]           server -> client (parses as a frame header with
                                                 version A5, so a client without a secret
                                                 reports AuthRequired instead of garbage)
    answer     "KR" A5 01 | mac[32]             client -> server
    verdict    "KC" A5 00                       OK
               "KC" A5 FF | u16 len | reason    refused, then the server closes

The secret comes from ``[auth]`` in a TOML file, ``KVCAKE_AUTH_SECRET`` /
``KVCAKE_AUTH_SECRET_FILE`` or ``--auth-secret-file`` (:func:`load_auth`). A process that was
given no :class:`Authenticator` explicitly uses the environment's (:func:`resolve`).
Binding anything but loopback without a secret is refused (:func:`check_bind`).

HTTP has no connection handshake: each request is signed instead (:mod:`kvcake.core.http_auth`,
:meth:`Authenticator.http_headers`), and the KV-event stream uses CURVE keys derived from the
secret (:meth:`Authenticator.derive`, :mod:`kvcake.core.zmq_curve`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import ipaddress
import os
import socket
import struct
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kvcake.core.config import load_config, require, size_field
from kvcake.core.errors import ConfigError, KvcakeError, MalformedFrame
from kvcake.core.http_auth import HttpPolicy, sign

NONCE_SIZE = 32
MAC_SIZE = 32
AUTH_MARK = 0xA5  # the "version" byte of the challenge (kvcake frames use version 1)
CHALLENGE = b"KC" + bytes([AUTH_MARK, 1])
ANSWER = b"KR" + bytes([AUTH_MARK, 1])
VERDICT_OK = b"KC" + bytes([AUTH_MARK, 0])
VERDICT_NO = b"KC" + bytes([AUTH_MARK, 0xFF])
MIN_SECRET = 16  # bytes; shorter secrets are refused as a configuration error
HTTP_HEADER = "x-kvcake-auth"  # a signed request (core/http_auth.py)

# Service names mixed into the MAC: an answer for one service is useless for another.
MASTER = "master"
TRANSFER = "transfer"
DIRECTORY = "directory"
DISK = "disk"

ENV_HINT = (
    "set the shared secret: [auth] secret_file, KVCAKE_AUTH_SECRET(_FILE) or --auth-secret-file"
)


class AuthError(KvcakeError):
    """Authentication failed or is required: a wrong or missing shared secret."""


class AuthRequired(AuthError, MalformedFrame):
    """The peer sent an authentication challenge and this side has no secret."""


class AuthRefused(AuthError):
    """The peer refused this side's answer (the secrets differ)."""


class InsecureBind(ConfigError, AuthError):
    """A server would bind a non-loopback address without a shared secret."""


@dataclass(frozen=True)
class AuthConfig:
    """``[auth]``: ``secret`` (KVCAKE_AUTH_SECRET) or ``secret_file`` (KVCAKE_AUTH_SECRET_FILE,
    ``--auth-secret-file``: the file's content, surrounding whitespace stripped)."""

    secret: str = ""
    secret_file: Path | None = None
    handshake_timeout_s: float = 5.0
    # Signed HTTP requests (core/http_auth.py, docs/store.md "Authentication").
    http_window_s: float = 30.0
    http_max_skew_s: float = 5.0
    http_nonces: int = 131_072
    http_max_body: int = size_field("64MiB")
    http_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        require(
            not (self.secret and self.secret_file),
            "auth.secret and auth.secret_file exclude each other: set one",
        )
        require(self.handshake_timeout_s > 0, "auth.handshake_timeout_s must be > 0")
        self.http_policy()  # ConfigError names a bad http_* setting

    def http_policy(self) -> HttpPolicy:
        return HttpPolicy(
            self.http_window_s,
            self.http_max_skew_s,
            self.http_nonces,
            self.http_max_body,
            self.http_names,
        )

    def secret_bytes(self) -> bytes:
        if self.secret_file is not None:
            try:
                raw = self.secret_file.read_bytes().strip()
            except OSError as exc:
                raise ConfigError(f"auth.secret_file {self.secret_file}: {exc}") from exc
            require(raw != b"", f"auth.secret_file {self.secret_file} is empty")
        else:
            raw = self.secret.encode()
        require(
            not raw or len(raw) >= MIN_SECRET,
            f"the shared secret must be at least {MIN_SECRET} bytes (e.g. `openssl rand -hex 32`)",
        )
        return raw


class Authenticator:
    """Holds one shared secret; performs both sides of the handshake and checks HTTP headers."""

    def __init__(
        self,
        secret: bytes,
        handshake_timeout_s: float = 5.0,
        http_policy: HttpPolicy | None = None,
    ):
        if len(secret) < MIN_SECRET:
            raise ConfigError(f"the shared secret must be at least {MIN_SECRET} bytes")
        self._secret = secret
        self.timeout_s = handshake_timeout_s
        self.http_policy = http_policy or HttpPolicy()

    @classmethod
    def from_config(cls, cfg: AuthConfig) -> Authenticator | None:
        raw = cfg.secret_bytes()
        return cls(raw, cfg.handshake_timeout_s, cfg.http_policy()) if raw else None

    def __repr__(self) -> str:  # never print the secret
        return "Authenticator(<secret>)"

    def mac(self, nonce: bytes, context: str) -> bytes:
        return hmac.new(self._secret, nonce + context.encode(), hashlib.sha256).digest()

    def verify(self, nonce: bytes, context: str, mac: bytes) -> bool:
        return hmac.compare_digest(self.mac(nonce, context), mac)

    def mac_of(self, message: bytes) -> bytes:
        """HMAC-SHA256 of a whole message (signed HTTP requests)."""
        return hmac.new(self._secret, message, hashlib.sha256).digest()

    def derive(self, label: str) -> bytes:
        """32 bytes for one purpose (``label``), e.g. the events stream's CURVE keys: knowing
        one derived value tells nothing of the secret or of another label's value."""
        return self.mac_of(b"kvcake-derive\n" + label.encode())

    # --- sockets ---------------------------------------------------------------------------

    def server_handshake(self, sock: socket.socket, context: str) -> None:
        """Challenge the client; return once it answered correctly, else send the refusal,
        drain what it sent (so it can read the reason) and raise :class:`AuthError`."""
        nonce = os.urandom(NONCE_SIZE)
        with _timeout(sock, self.timeout_s):
            sock.sendall(CHALLENGE + nonce)
            head = _recv_exact(sock, len(ANSWER))
            if head != ANSWER:
                reason = (
                    f"this {context} server requires authentication and the peer sent a request "
                    f"without it: {ENV_HINT}"
                )
                _refuse(sock, reason)
                raise AuthError(reason)
            mac = _recv_exact(sock, MAC_SIZE)
            if not self.verify(nonce, context, mac):
                reason = f"authentication to the {context} server failed: the shared secrets differ"
                _refuse(sock, reason)
                raise AuthError(reason)
            sock.sendall(VERDICT_OK)

    def client_handshake(self, sock: socket.socket, context: str, peer: str = "") -> None:
        """Answer the server's challenge; raise :class:`AuthError` when it refuses or sends
        no challenge within the timeout (a server without a secret)."""
        where = f"{context} server {peer}".strip()
        with _timeout(sock, self.timeout_s):
            try:
                head = _recv_exact(sock, len(CHALLENGE) + NONCE_SIZE)
            except TimeoutError as exc:
                raise AuthError(
                    f"{where} sent no authentication challenge within {self.timeout_s}s: "
                    "is the shared secret configured on both sides?"
                ) from exc
            if head[: len(CHALLENGE)] != CHALLENGE:
                raise AuthError(f"{where} did not start with an authentication challenge")
            sock.sendall(ANSWER + self.mac(head[len(CHALLENGE) :], context))
            verdict = _recv_exact(sock, len(VERDICT_OK))
            if verdict == VERDICT_OK:
                return
            if verdict != VERDICT_NO:
                raise AuthError(f"{where} sent an unknown authentication verdict")
            (n,) = struct.unpack("<H", _recv_exact(sock, 2))
            reason = _recv_exact(sock, n).decode(errors="replace")
            raise AuthRefused(f"{where} refused the connection: {reason}")

    # --- HTTP ------------------------------------------------------------------------------

    def http_headers(
        self, method: str, url: str, service: str, body: bytes = b"", now: float | None = None
    ) -> dict[str, str]:
        """The signed header for one request to ``url`` (``http://host:port/path?query``),
        an HTTP server of ``service`` (``http_auth.MASTER_HTTP`` ...). The secret itself never
        goes over the wire; the header is good for that one request, once."""
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        authority = f"{parts.hostname}:{port}"
        return sign(self, service, authority, method, target.encode(), body, now)

    def bearer_ok(self, authorization: str) -> bool | None:
        """``Authorization: Bearer <secret>``: None when the header is not that form, else
        whether it holds the secret (the secret goes over the wire: private networks only)."""
        if authorization[:7].lower() != "bearer ":
            return None
        return hmac.compare_digest(authorization[7:].strip().encode(), self._secret)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise AuthError("connection closed during the authentication handshake")
        buf += chunk
    return bytes(buf)


def _refuse(sock: socket.socket, reason: str) -> None:
    """Send the refusal, then read and drop (bounded) what the client already sent: closing
    with unread input would reset the connection and the client might never see the reason."""
    body = reason.encode()[:4000]
    with contextlib.suppress(OSError):
        sock.sendall(VERDICT_NO + struct.pack("<H", len(body)) + body)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(0.5)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and sock.recv(1 << 16):
            pass


@contextlib.contextmanager
def _timeout(sock: socket.socket, seconds: float) -> Iterator[None]:
    prev = sock.gettimeout()
    sock.settimeout(seconds)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(prev)


# --- configuration ---------------------------------------------------------------------------


class _Disabled:
    """Pass ``DISABLED`` to turn authentication off even when the environment has a secret."""

    def __repr__(self) -> str:
        return "auth.DISABLED"


# Any: the sentinel is passed where an ``Authenticator | None`` is expected (resolve() reads it).
DISABLED: Any = _Disabled()


def load_auth(
    toml_path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
) -> Authenticator | None:
    """The ``[auth]`` settings from TOML < ``KVCAKE_AUTH_*`` < ``overrides``; None = no secret."""
    cfg = load_config(AuthConfig, toml_path=toml_path, section="auth", env=env, overrides=overrides)
    return Authenticator.from_config(cfg)


def resolve(auth: Authenticator | None) -> Authenticator | None:
    """An explicit authenticator, else the environment's (``KVCAKE_AUTH_SECRET(_FILE)``);
    :data:`DISABLED` means none."""
    if auth is DISABLED:
        return None
    if auth is not None:
        return auth
    return load_auth()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, auth: Authenticator | None, what: str) -> None:
    """Refuse to listen on a non-loopback ``host`` without a shared secret."""
    if auth is None and not is_loopback(host):
        raise InsecureBind(
            f"{what} would listen on {host or '0.0.0.0'} (not loopback) without a shared secret; "
            f"{ENV_HINT}"
        )


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """``--auth-secret-file`` for every command that serves or connects."""
    parser.add_argument(
        "--auth-secret-file",
        dest="auth_secret_file",
        default=None,
        help="file holding the cluster's shared secret (>= 16 bytes; also [auth] secret_file, "
        "KVCAKE_AUTH_SECRET_FILE or KVCAKE_AUTH_SECRET): required to listen on anything but "
        "loopback; every connection is then authenticated by an HMAC challenge",
    )


def setup_process(
    secret_file: str | None, toml_path: str | os.PathLike[str] | None = None
) -> Authenticator | None:
    """For a command: ``--auth-secret-file`` > ``KVCAKE_AUTH_*`` > ``[auth]`` of ``--config``,
    made the process default (exported as ``KVCAKE_AUTH_SECRET(_FILE)``, so every component
    of this process and every child it starts uses the same secret)."""
    over: dict[str, object] = {"secret_file": secret_file, "secret": "" if secret_file else None}
    cfg = load_config(AuthConfig, toml_path=toml_path, section="auth", overrides=over)
    found = Authenticator.from_config(cfg)
    if found is not None:
        if cfg.secret_file is not None:
            os.environ["KVCAKE_AUTH_SECRET_FILE"] = str(cfg.secret_file.resolve())
            os.environ.pop("KVCAKE_AUTH_SECRET", None)
        else:
            os.environ["KVCAKE_AUTH_SECRET"] = cfg.secret
            os.environ.pop("KVCAKE_AUTH_SECRET_FILE", None)
    return found
