"""The proxy's live web dashboard (``/dashboard``): static page shipped in the package (works
offline), fed by ``/dashboard/api/snapshot`` and the server-sent events of
``/dashboard/api/stream`` (docs/observability.md)."""

from kvcake.proxy.dashboard.routes import Dashboard

__all__ = ["Dashboard"]
