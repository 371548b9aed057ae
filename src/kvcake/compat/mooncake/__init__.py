"""A drop-in Mooncake (0.3.13 Python API) over kvcake: :mod:`.store` is ``mooncake.store``,
:mod:`.engine` is ``mooncake.engine``. ``kvcake mooncake-shim install`` makes
``import mooncake.store`` resolve to them; see docs/compat/mooncake.md.

The store names are loaded on first use, so importing a light submodule (``master_flags`` for
``kvcake master``'s flags) does not pull in the store client."""

from __future__ import annotations

from typing import Any

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        # lazy: CLI start-up
        from kvcake.compat.mooncake import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
