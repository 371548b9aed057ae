"""ZMQ CURVE for kvcake's own event stream (issue 32 §2), keys derived from the shared secret.

With a secret, the master's KV-event PUB socket is a CURVE server: traffic is encrypted and a
ZAP handler admits only the client key derived from the same secret, so a subscriber without
the secret (plain, or CURVE with keys of another secret) receives nothing. Both key pairs are
derived deterministically (``Authenticator.derive``: HMAC-SHA256 of the secret and a label,
z85-encoded as a CURVE secret key, its public key from ``zmq.curve_public``), so no key file
is distributed: every process holding the secret can subscribe. Without CURVE in libzmq
(``zmq.has("curve")`` false) a publisher with a secret refuses to start rather than fall back
to plaintext.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from kvcake.core.errors import ConfigError

if TYPE_CHECKING:
    import zmq.asyncio

    from kvcake.core.auth import Authenticator

SERVER_LABEL = "zmq-curve-events-server-1"
CLIENT_LABEL = "zmq-curve-events-client-1"
ZAP_DOMAIN = b"kvcake-events"


@dataclass(frozen=True)
class CurveKeys:
    """z85-encoded CURVE keys (40 bytes each)."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


def require_curve() -> None:
    if not zmq.has("curve"):
        raise ConfigError(
            "this libzmq has no CURVE support: with a shared secret, kvcake's KV events are "
            "only published encrypted and authenticated (install pyzmq with its bundled libzmq)"
        )


def curve_keys(auth: Authenticator) -> CurveKeys:
    require_curve()
    server = z85.encode(auth.derive(SERVER_LABEL))
    client = z85.encode(auth.derive(CLIENT_LABEL))
    return CurveKeys(zmq.curve_public(server), server, zmq.curve_public(client), client)


class _OnlyOurClient:
    """ZAP credentials provider: the client key derived from the secret, nothing else."""

    def __init__(self, key: bytes):
        self.key = key

    def callback(self, domain: str, key: bytes) -> bool:
        return bool(key == self.key)


class CurveServer:
    """A private zmq context whose ZAP handler admits only the derived client key (each
    publisher has its own: a context has one ZAP endpoint), and its CURVE server sockets."""

    def __init__(self, auth: Authenticator):
        self.keys = curve_keys(auth)
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._zap = ThreadAuthenticator(self.ctx)
        self._zap.start()
        self._zap.configure_curve_callback(
            ZAP_DOMAIN.decode(), _OnlyOurClient(self.keys.client_public)
        )

    def socket(self, kind: int) -> zmq.Socket[bytes]:
        sock = self.ctx.socket(kind)
        sock.curve_secretkey = self.keys.server_secret
        sock.curve_publickey = self.keys.server_public
        sock.curve_server = True
        sock.zap_domain = ZAP_DOMAIN
        return sock

    def close(self) -> None:
        self._zap.stop()
        self.ctx.term()


def secure_subscriber(
    sock: zmq.Socket[bytes] | zmq.asyncio.Socket, auth: Authenticator | None
) -> None:
    """Give a SUB socket the derived client keys (before ``connect``); no-op without a
    secret (the stream is then plain, on loopback unless ``master.events_host`` says else)."""
    if auth is None:
        return
    keys = curve_keys(auth)
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey = keys.client_public
    sock.curve_secretkey = keys.client_secret
