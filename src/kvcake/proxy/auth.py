"""The proxy's API keys and tenants (issue 15 §3-§4).

**API keys** (OpenAI's style): with keys configured (``proxy.api_keys`` entries ``KEY`` or
``KEY=TENANT``, or ``proxy.api_keys_file`` with one such entry per line), every ``/v1/``
request needs ``Authorization: Bearer KEY``; a missing or unknown key gets 401 with OpenAI's
error body. Keys are compared in constant time.

**Tenants**: a request's tenant is its key's tenant, else its ``x-tenant-id`` header (a header
naming another tenant than the key's is refused: 403). The tenant, and the body's ``cache_salt``
(as vLLM accepts it), salt the block-hash chain (``SamplingParams.cache_salt`` ->
``core.hashing.salted_root``): equal prompts of different tenants share no block, no store key,
no index entry (:func:`salt_of`).
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcake.core.api import SamplingParams
from kvcake.core.errors import ConfigError, KvcakeError

TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # as store.tenants
KEY_RE = re.compile(r"^[\x21-\x7e]{8,256}$")  # printable, no spaces
TENANT_HEADER = "x-tenant-id"
OPEN = frozenset({"/v1/cluster"})  # the admin view: kvcake status / top, liveness probes


class AuthFailure(KvcakeError):
    """A request the proxy refuses: ``status`` (400/401/403), OpenAI's ``kind`` and ``code``."""

    def __init__(self, message: str, status: int, kind: str, code: str | None):
        super().__init__(message)
        self.status, self.kind, self.code = status, kind, code

    def body(self) -> dict[str, object]:
        """OpenAI's error shape."""
        return {
            "error": {"message": str(self), "type": self.kind, "param": None, "code": self.code}
        }


def _redact(key: str) -> str:
    return f"{key[:3]}***{key[-4:]}" if len(key) > 10 else "***"


@dataclass(frozen=True)
class ApiKeys:
    """Accepted keys -> their tenant ("" = no tenant)."""

    keys: Mapping[str, str]

    @classmethod
    def load(cls, entries: Iterable[str] = (), path: Path | None = None) -> ApiKeys | None:
        """From config entries and/or a file (``#`` comments, blank lines skipped); None when
        no key is configured (the proxy is then open, as before)."""
        lines = list(entries)
        if path is not None:
            try:
                lines += path.read_text().splitlines()
            except OSError as exc:
                raise ConfigError(f"proxy.api_keys_file {path}: {exc}") from exc
        keys: dict[str, str] = {}
        for n, raw in enumerate(lines, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            key, _, tenant = line.partition("=")
            key, tenant = key.strip(), tenant.strip()
            if not KEY_RE.match(key):
                raise ConfigError(f"API key entry {n}: a key is 8-256 printable characters")
            if tenant and not TENANT_RE.match(tenant):
                raise ConfigError(f"API key entry {n}: bad tenant id {tenant[:80]!r}")
            keys[key] = tenant
        return cls(keys) if keys else None

    def tenant_of(self, authorization: str) -> str:
        """The tenant of the key in an ``Authorization`` header; AuthFailure(401) otherwise."""
        if not authorization:
            raise AuthFailure(
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                401, "invalid_request_error", None,
            )  # fmt: skip
        scheme, _, given = authorization.partition(" ")
        given = given.strip()
        if scheme.lower() != "bearer" or not given:
            raise AuthFailure(
                "The Authorization header must be 'Bearer YOUR_KEY'.",
                401, "invalid_request_error", "invalid_api_key",
            )  # fmt: skip
        found = None
        for key, tenant in self.keys.items():  # every key compared: no early exit on a match
            if hmac.compare_digest(key.encode(), given.encode()):
                found = tenant
        if found is None:
            raise AuthFailure(
                f"Incorrect API key provided: {_redact(given)}.",
                401, "invalid_request_error", "invalid_api_key",
            )  # fmt: skip
        return found


def tenant_for(keys: ApiKeys | None, headers: Mapping[str, str]) -> str:
    """The request's tenant: its key's, else ``x-tenant-id``, else "" (AuthFailure if bad)."""
    key_tenant = keys.tenant_of(headers.get("authorization", "")) if keys is not None else ""
    header = headers.get(TENANT_HEADER, "")
    if header and not TENANT_RE.match(header):
        raise AuthFailure(
            f"bad {TENANT_HEADER} {header[:80]!r}: use 1-64 characters [A-Za-z0-9._-], "
            "starting with a letter or digit",
            400, "invalid_request_error", "invalid_tenant",
        )  # fmt: skip
    if key_tenant and header and header != key_tenant:
        raise AuthFailure(
            f"{TENANT_HEADER} {header!r} is not this API key's tenant",
            403, "permission_error", "tenant_mismatch",
        )  # fmt: skip
    return key_tenant or header


def salt_of(tenant: str, cache_salt: str) -> str:
    """The chain's salt for a tenant and a request's ``cache_salt`` (either may be ""). A
    tenant alone salts with its name (as the vLLM connector's ``tenant``); a ``cache_salt``
    is prefixed ``salt:`` (tenant ids cannot hold ':'), so no body field can reach a tenant's
    chain."""
    if not cache_salt:
        return tenant
    return f"{tenant}/salt:{cache_salt}" if tenant else f"salt:{cache_salt}"


def salted(sampling: SamplingParams, tenant: str, cache_salt: str) -> SamplingParams:
    """The request's parameters with its chain's salt and the tenant charged for its pooled
    blocks (the store's tenant quotas)."""
    salt = salt_of(tenant, cache_salt)
    return dataclasses.replace(sampling, cache_salt=salt, tenant=tenant) if salt else sampling


class RequireApiKey:
    """ASGI middleware: ``/v1/`` requests need a configured key (401 with OpenAI's body);
    ``/health``, ``/metrics``, the dashboard and ``/v1/cluster`` (what ``kvcake status`` /
    ``top`` and liveness probes read) stay open."""

    def __init__(self, app: Any, keys: ApiKeys):
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if not path.startswith("/v1/") or path in OPEN:
            return await self.app(scope, receive, send)
        auth = next((v for k, v in scope["headers"] if k.lower() == b"authorization"), b"")
        try:
            self.keys.tenant_of(auth.decode("latin-1"))
        except AuthFailure as exc:
            body = json.dumps(exc.body()).encode()
            head = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
            await send({"type": "http.response.start", "status": exc.status, "headers": head})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
