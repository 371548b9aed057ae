"""Per-tenant byte quotas of the master (issue 15 §4).

A put names its tenant (``PutStart.tenant``, from the client's ``tenant`` setting; "" = none,
never limited). An object's size is charged to its tenant from ``put_start`` (a PROCESSING
object holds its space) until it leaves the pool however it leaves (remove, eviction, revoke,
pre-emption, segment loss). A ``put_start`` that would take its tenant past its quota is refused
with :class:`QuotaExceeded` *before* any allocation, so nothing (of this or any other tenant) is
evicted for it. Invariant (``check``): each tenant's charge == the sizes of its objects.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol

from kvcake.core.config import parse_size
from kvcake.core.errors import ConfigError
from kvcake.store.errors import InvalidParams, QuotaExceeded

TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_tenant(tenant: str) -> str:
    """A tenant id: "" (none) or 1-64 of ``[A-Za-z0-9._-]`` starting with a letter or digit."""
    if tenant and not TENANT_RE.match(tenant):
        raise InvalidParams(
            f"bad tenant id {tenant[:80]!r}: use 1-64 characters [A-Za-z0-9._-], "
            "starting with a letter or digit"
        )
    return tenant


def parse_quotas(entries: Iterable[str]) -> dict[str, int]:
    """``["teamA=10GiB", "teamB=512MB"]`` -> bytes per tenant (ConfigError names a bad entry)."""
    out: dict[str, int] = {}
    for entry in entries:
        name, sep, size = entry.partition("=")
        name = name.strip()
        if not sep or not TENANT_RE.match(name):
            raise ConfigError(f"master.tenant_quotas: {entry!r} is not TENANT=SIZE")
        out[name] = parse_size(size.strip())
    return out


class _Sized(Protocol):
    size: int
    tenant: str


class TenantQuotas:
    """Charges per tenant (bounded: only tenants with live objects are kept)."""

    def __init__(self, quotas: dict[str, int], default_quota: int = 0):
        self.quotas = quotas
        self.default_quota = default_quota  # for tenants not named in ``quotas``; 0 = none
        self.used: dict[str, int] = {}
        self.refused = 0

    def quota(self, tenant: str) -> int:
        """Bytes allowed to ``tenant``; 0 = unlimited."""
        if not tenant:
            return 0
        return self.quotas.get(tenant, self.default_quota)

    def admit(self, tenant: str, size: int) -> None:
        """Raise QuotaExceeded unless ``size`` more bytes fit in ``tenant``'s quota."""
        limit = self.quota(tenant)
        used = self.used.get(tenant, 0)
        if limit and used + size > limit:
            self.refused += 1
            raise QuotaExceeded(
                f"tenant {tenant!r} is over its quota: {used} B used + {size} B > {limit} B "
                "(remove some of its objects or raise master.tenant_quotas)"
            )

    def charge(self, tenant: str, size: int) -> None:
        if tenant:
            self.used[tenant] = self.used.get(tenant, 0) + size

    def release(self, tenant: str, size: int) -> None:
        if not tenant:
            return
        left = self.used.get(tenant, 0) - size
        if left > 0:
            self.used[tenant] = left
        else:
            self.used.pop(tenant, None)

    def check(self, objects: Iterable[_Sized]) -> None:
        want: dict[str, int] = {}
        for obj in objects:
            if obj.tenant:
                want[obj.tenant] = want.get(obj.tenant, 0) + obj.size
        assert want == self.used, (want, self.used)

    def stats(self) -> dict[str, dict[str, int]]:
        names = set(self.used) | set(self.quotas)
        return {t: {"used": self.used.get(t, 0), "quota": self.quota(t)} for t in sorted(names)}
