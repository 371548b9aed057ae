"""``setup_dummy``: a :class:`MooncakeDistributedStore` attached to a running ``mooncake_client``
(kvcake's stand-in) instead of holding its own kvcake client.

On success the store's class becomes :class:`DummyDistributedStore` (a subclass, so
``isinstance`` checks hold) and its client is a :class:`RemoteClient`: every Mooncake method
runs the same compat code as a normal store, over the real client. The overrides below are
where the wheel's dummy answers differently (probed on 0.3.13.post1; docs/compat/mooncake.md,
"Dummy clients"): buffer registration only of whole ``alloc_from_mem_pool`` blocks, pointer
calls only on registered memory, no hostname, and the families a dummy does not forward."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

from kvcake.compat.mooncake._base import check_key, check_signature, returns
from kvcake.compat.mooncake._dummy_client import RemoteClient
from kvcake.core.errors import KvcakeError, StoreError
from kvcake.store import errors as E

if TYPE_CHECKING:  # checked against its host; at run time its base is the store's own class
    from kvcake.compat.mooncake.store import MooncakeDistributedStore as _Host
else:
    _Host = object

log = logging.getLogger(__name__)
NO_LIMIT = 1 << 62  # the RemoteClient checks what must fit in the local buffer


def attach(store: _Host, pool: int, local: int, address: str) -> int:
    """0 attached, -1 when no real client answers at ``address`` (the wheel's code)."""
    try:
        remote = RemoteClient(address, local, pool)
    except (OSError, KvcakeError, ValueError) as exc:
        log.error("setup_dummy: cannot attach to a real client at %s: %s", address, exc)
        return E.INTERNAL_ERROR
    store._client = cast(Any, remote)
    store._local_buffer = NO_LIMIT
    store._hostname = ""
    store.__class__ = _dummy_class(type(store))
    return 0


_CLASSES: dict[str, type] = {}  # one per store class (MooncakeDistributedStore, subclasses)


def _dummy_class(host: type) -> type:
    """``DummyDistributedStore``: the store's own class with the dummy's overrides on top (made
    from the instance's class, so this module need not import the store module that imports
    it: no import circle)."""
    name = f"{host.__module__}.{host.__qualname__}"
    if name not in _CLASSES:
        _CLASSES[name] = type("DummyDistributedStore", (DummyMethods, host), {"_plain_class": host})
    return _CLASSES[name]


class DummyMethods(_Host):
    """What a dummy does differently from a store with its own client (see the module)."""

    _plain_class: type

    @property
    def _remote(self) -> RemoteClient:
        return cast(RemoteClient, self._client)

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        check_signature(mem_pool_size, local_buffer_size, server_address, kinds=(int, int, str))
        return 0  # the wheel keeps the first attachment and reports success

    def close(self) -> int:
        """Detach (the real client unmaps this dummy's memory); the store is a plain, not set
        up store again."""
        rc = super().close()
        self.__class__ = self._plain_class
        return rc

    def setup(self, *args: Any, **kwargs: Any) -> int:
        return E.INTERNAL_ERROR  # a dummy is never set up as a real client (the wheel: -1)

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int) -> int:
        check_signature(protocol, device_name, mount_segment_size, kinds=(str, str, int))
        return E.INTERNAL_ERROR

    def health_check(self) -> int:
        return 1 if self._client is None else 2  # the wheel's dummy answers 2, attached or not

    # --- shared memory ------------------------------------------------------------------------

    def alloc_from_mem_pool(self, size: int) -> int:
        check_signature(size, kinds=(int,))
        if self._client is None:
            return 0
        try:
            return self._remote.alloc(size)
        except (KvcakeError, OSError) as exc:
            log.error("alloc_from_mem_pool(%d): %s", size, exc)
            return 0

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Only a whole ``alloc_from_mem_pool`` block (the wheel: -1 otherwise)."""
        check_signature(buffer_ptr, size, kinds=(int, int))
        seg = self._remote.segs.at(buffer_ptr) if self._client is not None else None
        if seg is None or seg[1] != size:
            return E.INTERNAL_ERROR
        self._remote.segs.registered.add(seg[0])
        self._registered[buffer_ptr] = size
        return 0

    def unregister_buffer(self, buffer_ptr: int) -> int:
        check_signature(buffer_ptr, kinds=(int,))
        seg = self._remote.segs.at(buffer_ptr) if self._client is not None else None
        if seg is None or seg[0] not in self._remote.segs.registered:
            return E.INTERNAL_ERROR
        self._remote.segs.registered.discard(seg[0])
        self._registered.pop(buffer_ptr, None)
        return 0

    def _outside(self, ptrs: list[Any], sizes: list[Any]) -> bool:
        remote = self._remote
        return any(
            not (isinstance(p, int) and isinstance(n, int) and remote.segs.find(p, n) is not None)
            for p, n in zip(ptrs, sizes, strict=False)
        )

    # --- pointer calls: registered memory only (the wheel: -600) ------------------------------

    @returns(int)
    def put_from(self, key: str, buffer_ptr: int, size: int, config: Any = None) -> int:
        if self._outside([buffer_ptr], [size]):
            return E.INVALID_PARAMS
        return super().put_from(key, buffer_ptr, size, config)

    @returns(int)
    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: Any = None) -> int:
        if self._outside([buffer_ptr], [size]):
            return E.INVALID_PARAMS
        return super().upsert_from(key, buffer_ptr, size, config)

    @returns(int)
    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        if self._outside([buffer_ptr], [size]):
            return E.INVALID_PARAMS
        return super().get_into(key, buffer_ptr, size)

    def _batch_ptr_ok(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> bool:
        return len(keys) != len(ptrs) or len(ptrs) != len(sizes) or not self._outside(ptrs, sizes)

    @returns([])
    def batch_put_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int], config: Any = None
    ) -> list[int]:
        if not self._batch_ptr_ok(keys, buffer_ptrs, sizes):
            return [E.INVALID_PARAMS] * len(keys)
        return super().batch_put_from(keys, buffer_ptrs, sizes, config)

    @returns([])
    def batch_upsert_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int], config: Any = None
    ) -> list[int]:
        if not self._batch_ptr_ok(keys, buffer_ptrs, sizes):
            return [E.INVALID_PARAMS] * len(keys)
        return super().batch_upsert_from(keys, buffer_ptrs, sizes, config)

    @returns([])
    def batch_get_into(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]:
        if not self._batch_ptr_ok(keys, buffer_ptrs, sizes):
            return [E.INVALID_PARAMS] * len(keys)
        return super().batch_get_into(keys, buffer_ptrs, sizes)

    # --- reads that the base class runs on the kvcake client's internals ----------------------

    @returns(b"")
    def get(self, key: str) -> bytes:
        check_key(key)
        got = self._remote.get_bytes([key])[0] if key else b""
        return b"" if isinstance(got, StoreError) else got

    def get_batch(self, keys: list[str]) -> list[bytes]:
        if not isinstance(keys, list):
            raise TypeError("keys must be a list of str")
        if self._client is None or not keys:
            return [b""] * max(len(keys), 1)
        try:
            got = self._remote.get_bytes(keys)
        except KvcakeError:
            return [b""] * len(keys)
        return [b"" if isinstance(g, StoreError) else g for g in got]

    def is_exist(self, key: str) -> int:
        """1, 0, or the error code (the wheel's dummy answers -900 once the real client is gone)."""
        check_key(key)
        if self._client is None or not key:
            return -1
        try:
            return int(self._remote.is_exist(key))
        except StoreError as exc:
            return exc.code
        except KvcakeError:
            return -1

    # --- not forwarded by a dummy (the wheel's answers) ---------------------------------------

    def get_replica_desc(self, key: str) -> list[Any]:
        check_key(key)
        return []

    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[Any]]:
        return {}

    def create_copy_task(self, key: str, targets: list[str]) -> tuple[tuple[int, int], int]:
        return (0, 0), E.INVALID_PARAMS

    def create_move_task(self, key: str, source: str, target: str) -> tuple[tuple[int, int], int]:
        return (0, 0), E.INVALID_PARAMS

    # Sessions need the master connection a dummy does not have (the wheel's dummy: -600).
    def batch_put_session_start(
        self, keys: list[str], sizes: list[int], config: Any = None
    ) -> list[int]:
        return [E.INVALID_PARAMS] * len(keys)

    def batch_put_session_end(self, keys: list[str]) -> list[int]:
        return [E.INVALID_PARAMS] * len(keys)

    def batch_put_session_revoke(self, keys: list[str]) -> list[int]:
        return [E.INVALID_PARAMS] * len(keys)

    def batch_get_session_start(self, keys: list[str]) -> list[int]:
        return [E.INVALID_PARAMS] * len(keys)

    def batch_get_session_end(self, keys: list[str]) -> int:
        return E.INVALID_PARAMS
