"""A drop-in Mooncake (0.3.13 Python API) over kvcake: :mod:`.store` is ``mooncake.store``,
:mod:`.engine` is ``mooncake.engine``. ``kvcake mooncake-shim install`` makes
``import mooncake.store`` resolve to them; see docs/compat/mooncake.md."""

from kvcake.compat.mooncake.store import (
    MooncakeDistributedStore,
    ReplicateConfig,
    SoftPinAction,
)

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction"]
