"""Where the master's KV-event streams bind, and in which form (issue 32 §2; docs/store.md,
"KV events"). Key names are what tenants must not learn from each other, so a stream never
goes beyond loopback in plaintext unless someone asked for exactly that.

- **kvcake's own stream** (``events_port``; the proxy's pool index and the instances' store
  watch subscribe): with a shared secret it binds ``events_host`` or else the master's host,
  CURVE-encrypted, for subscribers holding the secret only (``core/zmq_curve.py``); without a
  secret it binds 127.0.0.1 unless ``events_host`` is set, which is then plaintext (warned).
- **The ecosystem-format stream** (``ecosystem_events_port``, vLLM's wire format for other
  routers, which speak no CURVE): off by default; 127.0.0.1 unless ``events_public_host``;
  with a shared secret it is refused unless ``events_allow_plain = true`` (then warned).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kvcake.core.auth import is_loopback
from kvcake.core.errors import ConfigError

if TYPE_CHECKING:
    from kvcake.core.auth import Authenticator
    from kvcake.store.config import MasterConfig

log = logging.getLogger(__name__)
LOOPBACK = "127.0.0.1"


def own_events_host(cfg: MasterConfig, auth: Authenticator | None) -> str:
    """The host kvcake's own event stream binds."""
    if auth is not None:
        return cfg.events_host or cfg.host
    if not cfg.events_host:
        return LOOPBACK
    if not is_loopback(cfg.events_host):
        log.warning(
            "master: KV events in plaintext on %s (master.events_host, no shared secret): "
            "every key name is readable by anyone who can reach it",
            cfg.events_host,
        )
    return cfg.events_host


def ecosystem_events_host(cfg: MasterConfig, auth: Authenticator | None) -> str | None:
    """The host the ecosystem-format stream binds, or None when it is off; ConfigError when a
    secret is set and plaintext was not allowed."""
    if cfg.ecosystem_events_port < 0:
        return None
    host = cfg.events_public_host or LOOPBACK
    if auth is not None:
        if not cfg.events_allow_plain:
            raise ConfigError(
                "master.ecosystem_events_port: the ecosystem-format KV events are plaintext "
                "(their consumers speak no CURVE) and a shared secret is set: set "
                "master.events_allow_plain = true to publish them anyway"
            )
        log.warning(
            "master: ecosystem-format KV events in plaintext on %s:%d despite the shared "
            "secret (master.events_allow_plain): key names and block hashes are readable by "
            "anyone who can reach it",
            host,
            cfg.ecosystem_events_port,
        )
    return host
