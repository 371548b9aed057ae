"""Mooncake Store: a distributed KV-cache pool over the DRAM (and SSD) of several processes.

- :class:`~kvcake.store.master_server.Master` — control plane (``kvcake master``).
- :class:`~kvcake.store.server.StoreServer` — a storage node (``kvcake store-server``).
- :class:`~kvcake.store.client.Client` — put/get from any process; see docs/store.md.
"""

from kvcake.store.config import ClientConfig, MasterConfig, StoreServerConfig
from kvcake.store.errors import (
    InvalidParams,
    LeaseExpired,
    NoSpace,
    ObjectAlreadyExists,
    ObjectHasLease,
    ObjectNotFound,
    RpcFailed,
)
from kvcake.store.protocol import PutOptions

__all__ = [
    "ClientConfig",
    "InvalidParams",
    "LeaseExpired",
    "MasterConfig",
    "NoSpace",
    "ObjectAlreadyExists",
    "ObjectHasLease",
    "ObjectNotFound",
    "PutOptions",
    "RpcFailed",
    "StoreServerConfig",
]
