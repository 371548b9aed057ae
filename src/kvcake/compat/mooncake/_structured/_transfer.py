"""``MooncakeBundleTransfer``: bundles, structured objects and DataProtos through a Mooncake store
(kvcake's ``MooncakeDistributedStore`` or anything with its methods)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kvcake.compat.mooncake._structured import _manifest as M
from kvcake.compat.mooncake._structured._bundle import BundleStore
from kvcake.compat.mooncake._structured._dataproto import DataProtos
from kvcake.compat.mooncake._structured._fields import bytes_view
from kvcake.compat.mooncake._structured._objects import StructuredObjects
from kvcake.compat.mooncake._structured._port import Port
from kvcake.compat.mooncake._structured._types import (
    BundleTransferPolicy,
    RemoteBundleRef,
    StructuredObjectPayload,
    StructuredObjectReadSpec,
    StructuredObjectResult,
)
from kvcake.core.via import Via

DEFAULT_BUNDLE_CHUNK_BYTES = 64 * 1024**2
WRAPPED = "__mooncake_wrapped_object__"
Ref = RemoteBundleRef | Mapping[str, Any]


class MooncakeBundleTransfer:
    """Owns the bundle store (chunked objects in ``store``), the structured-object part over it
    and the DataProto part over both; the DataProto methods are that part's (``Via``). Holds no
    lock: thread safety is the store's. Results are fresh memory the caller owns, except
    ``materialize_into``'s, which fill the caller's destinations."""

    def __init__(
        self,
        store: Any,
        key_prefix: str = "bundle",
        default_chunk_bytes: int = DEFAULT_BUNDLE_CHUNK_BYTES,
        buffer_pool: Any = None,
    ) -> None:
        self.store = store
        self.key_prefix = M.normalize_prefix(key_prefix)
        self.default_chunk_bytes = M.check_chunk_bytes(default_chunk_bytes)
        self.buffer_pool = buffer_pool  # kept; kvcake registers caller memory directly
        self._bundles = BundleStore(Port(store), self.key_prefix, self.default_chunk_bytes)
        self._objects = StructuredObjects(self._bundles)
        self._dataprotos = DataProtos(self._bundles, self._objects)

    put = Via("_dataprotos", DataProtos.put)
    put_dataproto = Via("_dataprotos", DataProtos.put_dataproto)
    append_dataproto_fields = Via("_dataprotos", DataProtos.append_dataproto_fields)
    get = Via("_dataprotos", DataProtos.get)
    get_dataproto = Via("_dataprotos", DataProtos.get_dataproto)
    dataproto_manifest_view = Via("_dataprotos", DataProtos.dataproto_manifest_view)
    cleanup_dataproto = Via("_dataprotos", DataProtos.cleanup_dataproto)
    cleanup_dataproto_append = Via("_dataprotos", DataProtos.cleanup_dataproto_append)

    def put_bundle(
        self,
        meta: Any,
        buffers: Mapping[str, Any],
        partition: str = "default",
        chunk_bytes: int | None = None,
        policy: BundleTransferPolicy | None = None,
        max_inflight_put: int | None = None,
        config: Any = None,
    ) -> RemoteBundleRef:
        """Raw metadata bytes plus named bytes-like buffers, as one bundle."""
        opts = self._bundles.options(chunk_bytes, policy, max_inflight_put, config)
        M.check_segment(partition, "partition")
        payloads = {}
        for name, value in buffers.items():
            M.check_segment(name, "buffer name")
            payloads[name] = bytes_view(value, name)
        return self._bundles.put(bytes_view(meta, "meta"), payloads, partition, opts)

    def remove_bundle(self, ref: Ref) -> None:
        self._bundles.remove(ref)

    def put_structured_object(
        self,
        payload: StructuredObjectPayload,
        partition: str = "default",
        chunk_bytes: int | None = None,
        policy: BundleTransferPolicy | None = None,
        max_inflight_put: int | None = None,
        config: Any = None,
        pre_registered_buffers: Mapping[str, bool] | None = None,
    ) -> RemoteBundleRef:
        opts = self._bundles.options(chunk_bytes, policy, max_inflight_put, config)
        return self._objects.put(payload, partition, opts, pre_registered_buffers)

    def put_object(self, obj: Any, partition: str = "default", **kwargs: Any) -> RemoteBundleRef:
        """A mapping of members, or one array / tensor (read back as itself by get_object)."""
        if isinstance(obj, Mapping):
            payload = StructuredObjectPayload(metadata={}, buffers=obj)
        else:
            payload = StructuredObjectPayload(metadata={WRAPPED: True}, buffers={"value": obj})
        return self.put_structured_object(payload, partition, **kwargs)

    def get_object(self, ref: Ref) -> Any:
        result = self.materialize(self.read_spec(ref))
        return result.objects["value"] if result.metadata.get(WRAPPED) else result.objects

    def read_spec(self, ref: Ref) -> StructuredObjectReadSpec:
        return StructuredObjectReadSpec(ref=ref)

    def materialize(self, spec: StructuredObjectReadSpec) -> StructuredObjectResult:
        return self._objects.materialize(spec)

    def materialize_into(
        self, spec: StructuredObjectReadSpec, destinations: Mapping[str, Any] | None
    ) -> StructuredObjectResult:
        return self._objects.materialize(spec, destinations)

    @staticmethod
    def release_result(result: Any) -> None:
        """Releases the pool leases a result holds. kvcake's reads return ordinary memory, so
        only leases a caller attached (``_mooncake_pool_owner``) are released."""
        seen: set[int] = set()
        stack = [result]
        while stack:
            value = stack.pop()
            owner = getattr(value, "_mooncake_pool_owner", None)
            if owner is not None:
                if id(owner) not in seen:
                    seen.add(id(owner))
                    owner.release()
                continue
            if id(value) in seen:
                continue
            seen.add(id(value))
            stack.extend(_children(value))


def _children(value: Any) -> Sequence[Any]:
    if isinstance(value, Mapping):
        return list(value.values())
    if hasattr(value, "batch") and hasattr(value, "non_tensor_batch"):
        return [value.batch, value.non_tensor_batch, getattr(value, "meta_info", None)]
    if isinstance(value, list | tuple):
        return list(value)
    if isinstance(value, np.ndarray) and value.dtype == object:
        return list(value.flat)
    return []
