"""kvcake as LMCache's remote storage: a ``RemoteConnector`` plugin (LMCache 0.5.x).

Configured in LMCache's YAML/env config (docs/integrations/lmcache.md)::

    remote_storage_plugins: ["kvcake"]
    extra_config:
      remote_storage_plugin.kvcake.module_path: kvcake.integrations.lmcache.connector
      remote_storage_plugin.kvcake.class_name: KvcakeConnectorAdapter
      remote_storage_plugin.kvcake.master: 127.0.0.1:50051

Objects go through ``kvcake.store.client.Client`` (so they carry integrity checksums) as
``layout header || chunk bytes`` (``layout.py``). Needs LMCache importable: run it in the
LMCache venv (``make install-lmcache``)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from kvcake.integrations.lmcache import layout as L
from kvcake.store.client import Client
from kvcake.store.errors import ObjectAlreadyExists, ObjectNotFound, StoreError

log = logging.getLogger(__name__)
KEY_PREFIX = "lmcache/"


def layout_of(shapes: Any, dtypes: Any, fmt: Any) -> L.Layout:
    groups = tuple(
        L.Group(str(d), d.itemsize, tuple(int(x) for x in s))
        for s, d in zip(shapes, dtypes, strict=True)
    )
    return L.Layout(fmt.name, groups)


class KvcakeRemoteConnector(RemoteConnector):
    """Blocking kvcake client calls run in the event loop's executor."""

    def __init__(self, context: ConnectorContext, settings: dict[str, str]):
        super().__init__(context.config, context.metadata)
        if "master" not in settings:
            raise ValueError(
                "remote_storage_plugin.<name>.master (host:port of a kvcake master) is required"
            )
        self.loop = context.loop
        self.local_cpu_backend = context.local_cpu_backend
        self.expected = layout_of(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
        self.client = Client(master=settings["master"], protocol=settings.get("protocol", "auto"))
        # Why a get missed although the key existed; read by tests and operators.
        self.errors = {"layout_mismatch": 0, "store_error": 0, "bad_put": 0}

    @staticmethod
    def pool_key(key: Any) -> str:
        return KEY_PREFIX + key.to_string()

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await self.loop.run_in_executor(None, fn, *args)

    def exists_sync(self, key: Any) -> bool:
        return self.client.is_exist(self.pool_key(key))

    async def exists(self, key: Any) -> bool:
        return await self._run(self.exists_sync, key)

    def _fail(self, kind: str, key: Any, err: Exception) -> None:
        self.errors[kind] += 1
        log.error("kvcake LMCache %s for %s: %s", kind, key.to_string(), err)

    def get_sync(self, key: Any) -> Any:
        """The chunk as a MemoryObj from LMCache's CPU allocator, or None (a miss; on a
        layout mismatch or a store error the miss is logged and counted)."""
        try:
            blob = self.client.get(self.pool_key(key))
            stored, offset = L.decode(blob)
            L.check(stored, self.expected)
        except ObjectNotFound:
            return None
        except L.LayoutMismatch as e:
            self._fail("layout_mismatch", key, e)
            return None
        except StoreError as e:
            self._fail("store_error", key, e)
            return None
        shapes = [torch.Size(g.shape) for g in stored.groups]
        obj = self.local_cpu_backend.allocate(shapes, self.meta_dtypes, self.meta_fmt)
        if obj is None:  # LMCache's CPU buffer is full: a miss, as its own connectors do
            return None
        dst = memoryview(obj.byte_array).cast("B")
        if len(dst) != stored.nbytes:
            obj.ref_count_down()
            self._fail(
                "layout_mismatch",
                key,
                L.LayoutMismatch(f"allocator gave {len(dst)} bytes for {stored.nbytes}"),
            )
            return None
        dst[:] = memoryview(blob)[offset:]
        return obj

    async def get(self, key: Any) -> Any:
        return await self._run(self.get_sync, key)

    def put_sync(self, key: Any, memory_obj: Any) -> None:
        """Store one chunk. BadChunk if its bytes disagree with its shapes/dtypes,
        LayoutMismatch if no reader with this engine's layout could use it."""
        try:
            mine = layout_of(
                memory_obj.get_shapes(), memory_obj.get_dtypes(), memory_obj.get_memory_format()
            )
            payload = memoryview(memory_obj.byte_array).cast("B")
            if len(payload) != mine.nbytes:
                raise L.BadChunk(
                    f"chunk has {len(payload)} bytes, its shapes/dtypes make {mine.nbytes}"
                )
            L.check(mine, self.expected)
        except (L.BadChunk, L.LayoutMismatch) as e:
            self.errors["bad_put"] += 1
            raise type(e)(f"kvcake LMCache put {key.to_string()}: {e}") from e
        with contextlib.suppress(ObjectAlreadyExists):  # content-addressed: same key, same chunk
            self.client.put(self.pool_key(key), L.encode(mine) + payload)

    async def put(self, key: Any, memory_obj: Any) -> None:
        await self._run(self.put_sync, key, memory_obj)

    def remove_sync(self, key: Any) -> bool:
        try:
            self.client.remove(self.pool_key(key))
            return True
        except StoreError:
            return False

    async def list(self) -> list[str]:
        raise NotImplementedError("a kvcake pool does not enumerate its keys to clients")

    async def close(self) -> None:
        self.client.close()


class KvcakeConnectorAdapter(ConnectorAdapter):
    """What ``class_name`` names: LMCache's generic wrapper for a bare RemoteConnector does not
    pass the engine metadata or the plugin name, which the connector needs."""

    def __init__(self) -> None:
        super().__init__("kvcake://")

    def can_parse(self, url: str) -> bool:
        return url.startswith(self.schema) or url.startswith("plugin://kvcake")

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        name = context.plugin_name or "kvcake"
        extra = (context.config.extra_config or {}) if context.config else {}
        prefix = f"remote_storage_plugin.{name}."
        settings = {k[len(prefix) :]: str(v) for k, v in extra.items() if k.startswith(prefix)}
        return KvcakeRemoteConnector(context, settings)
