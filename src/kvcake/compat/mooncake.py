"""A drop-in ``MooncakeDistributedStore`` (plus ``ReplicateConfig`` and ``SoftPinAction``) over
:class:`kvcake.store.client.Client`, with Mooncake 0.3.13's return conventions: integers (0 ok,
negative error codes), ``b""`` on a miss, ``put`` never overwriting (returns 0), -600 for empty
keys/values, mismatched batches or too-small buffers, -704 for a missing key, -706 for a leased
one, -200 when no segment has room. Methods called before ``setup`` return an error (-1, ``b""``,
``None`` or a list of those) instead of raising. Integer addresses (``put_from``, ``get_into``,
``register_buffer``) are viewed through ctypes; the caller guarantees they stay valid.

Differences: ``metadata_server`` is ignored (the kvcake master hosts the directory), and the
``protocol`` argument does not select TCP: like Mooncake, same-host replicas are copied through
shared memory; set ``KVCAKE_SHIM_PROTOCOL=tcp`` to force TCP.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

from kvcake.compat._base import ReplicateConfig, SoftPinAction, StoreBase, _returns
from kvcake.compat._pointers import PointerMethods
from kvcake.compat._tensors import TensorMethods
from kvcake.core.config import parse_size
from kvcake.core.errors import KvcakeError, StoreError
from kvcake.store import errors as E
from kvcake.store.client import Client
from kvcake.store.config import ClientConfig

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction"]


class MooncakeDistributedStore(PointerMethods, TensorMethods, StoreBase):
    # --- lifecycle ----------------------------------------------------------------------------

    def setup(
        self,
        local_hostname: str | dict[str, Any] = "127.0.0.1",
        metadata_server: str = "P2PHANDSHAKE",
        global_segment_size: int | str = 16 * 1024 * 1024,
        local_buffer_size: int | str = 16 * 1024 * 1024,
        protocol: str = "tcp",
        rdma_devices: str = "",
        master_server_addr: str = "127.0.0.1:50051",
    ) -> int:
        if isinstance(local_hostname, dict):
            cfg = local_hostname
            return self.setup(
                cfg.get("local_hostname", "127.0.0.1"),
                cfg.get("metadata_server", "P2PHANDSHAKE"),
                cfg.get("global_segment_size", 16 * 1024 * 1024),
                cfg.get("local_buffer_size", 16 * 1024 * 1024),
                cfg.get("protocol", "tcp"),
                str(cfg.get("device_name", cfg.get("rdma_devices", ""))),
                str(
                    cfg.get(
                        "master_server_address", cfg.get("master_server_addr", master_server_addr)
                    )
                ),
            )
        if self._client is not None:
            return E.INVALID_PARAMS  # already set up
        try:
            segment = parse_size(global_segment_size)
            self._local_buffer = parse_size(local_buffer_size)
            host = local_hostname.rsplit(":", 1)[0] if ":" in local_hostname else local_hostname
            proto = os.environ.get("KVCAKE_SHIM_PROTOCOL", "auto")
            self._client = Client(
                ClientConfig(
                    master=master_server_addr,
                    hostname=host or "127.0.0.1",
                    protocol=proto,
                    segment_size=segment,
                )
            )
        except StoreError as exc:
            return exc.code
        except (KvcakeError, TypeError, ValueError):
            return E.INVALID_PARAMS
        self._hostname = local_hostname
        return 0

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int = 16 << 20) -> int:
        return 0 if self._client is not None else E.INTERNAL_ERROR

    def close(self) -> int:
        if self._client is not None:
            self._client.close()
            self._client = None
        return 0

    def health_check(self) -> int:
        if self._client is None:
            return 1
        try:
            self._client.is_exist("__kvcake_health__")
        except KvcakeError:
            return 2
        return 0

    def get_hostname(self) -> str:
        return self._hostname

    # --- puts ---------------------------------------------------------------------------------

    @_returns(int)
    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        return self._put(key, memoryview(value).cast("B"), config, upsert=False)

    @_returns(int)
    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        return self._put(key, memoryview(value).cast("B"), config, upsert=True)

    @_returns(int)
    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        return self._put(key, memoryview(b"".join(bytes(p) for p in parts)), config, False)

    @_returns(int)
    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        return self._put(key, memoryview(b"".join(bytes(p) for p in parts)), config, True)

    @_returns(int)
    def put_batch(
        self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None
    ) -> int:
        views = [memoryview(v).cast("B") for v in values]
        return next((c for c in self._put_batch(keys, views, config, False) if c), 0)

    @_returns(int)
    def upsert_batch(
        self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None
    ) -> int:
        views = [memoryview(v).cast("B") for v in values]
        return next((c for c in self._put_batch(keys, views, config, True) if c), 0)

    # --- gets ---------------------------------------------------------------------------------

    @_returns(b"")
    def get(self, key: str) -> bytes:
        if not key:
            return b""
        got = self.client.batch_get([key])[0]
        return b"" if isinstance(got, StoreError) else bytes(got)

    @_returns([])
    def get_batch(self, keys: list[str]) -> list[bytes]:
        got = self.client.batch_get(keys)
        return [b"" if isinstance(g, StoreError) else bytes(g) for g in got]

    @_returns(None)
    def get_buffer(self, key: str) -> memoryview | None:
        got = self.get(key)
        return memoryview(got) if got else None

    @_returns([])
    def batch_get_buffer(self, keys: list[str]) -> list[memoryview | None]:
        return [memoryview(g) if g else None for g in self.get_batch(keys)]

    @_returns(int)
    def get_size(self, key: str) -> int:
        return self.client.get_size(key)

    def is_exist(self, key: str) -> int:
        """1 exists, 0 does not, -1 on any error (Mooncake's convention for this call)."""
        if self._client is None or not isinstance(key, str) or not key:
            return -1
        try:
            return int(self._client.is_exist(key))
        except KvcakeError:
            return -1

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        if self._client is None:
            return []
        return [self.is_exist(k) for k in keys]

    @_returns([])
    def get_replica_desc(self, key: str) -> list[dict[str, Any]]:
        res = self.client.get_replica_desc(key)
        return [msgspec.structs.asdict(r) for r in res.replicas]

    @_returns({})
    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[dict[str, Any]]]:
        return {k: self.get_replica_desc(k) for k in keys}

    # --- removal ------------------------------------------------------------------------------

    @_returns(int)
    def remove(self, key: str, force: bool = False) -> int:
        if not key:
            return E.INVALID_PARAMS
        self.client.remove(key, force)
        return 0

    @_returns([])
    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]:
        return [r.code if r is not None else 0 for r in self.client.batch_remove(keys, force)]

    @_returns(int)
    def remove_by_regex(self, pattern: str, force: bool = False) -> int:
        return self.client.remove_by_regex(pattern, force)

    @_returns(int)
    def remove_all(self, force: bool = False) -> int:
        return self.client.remove_all(force)
