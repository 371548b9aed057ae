"""``setup_dummy``: a :class:`MooncakeDistributedStore` attached to a running ``mooncake_client``
(kvcake's stand-in) instead of holding its own kvcake client.

On success the store's Conn holds a :class:`RemoteClient` and the store runs on the parts below
(:func:`dummy_parts`): every Mooncake method runs the same compat code as a normal store, over
the real client, except where the wheel's dummy answers differently (probed on 0.3.13.post1;
docs/compat/mooncake.md, "Dummy clients"): buffer registration only of whole
``alloc_from_mem_pool`` blocks, pointer calls only on registered memory, no hostname, and the
families a dummy does not forward. Each dummy part is its plain part with those calls changed."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, cast

from kvcake.compat.mooncake._base import Conn, check_key, check_signature, returns
from kvcake.compat.mooncake._dummy_client import RemoteClient
from kvcake.compat.mooncake._kv import KvOps
from kvcake.compat.mooncake._parts import Parts
from kvcake.compat.mooncake._pointers import PointerOps
from kvcake.compat.mooncake._replicas import Replicas
from kvcake.compat.mooncake._sessions import Sessions
from kvcake.compat.mooncake._setup import Lifecycle
from kvcake.core.errors import KvcakeError, StoreError
from kvcake.store import errors as E

log = logging.getLogger(__name__)
NO_LIMIT = 1 << 62  # the RemoteClient checks what must fit in the local buffer


def attach(conn: Conn, pool: int, local: int, address: str) -> int:
    """0 attached, -1 when no real client answers at ``address`` (the wheel's code)."""
    try:
        remote = RemoteClient(address, local, pool)
    except (OSError, KvcakeError, ValueError) as exc:
        log.error("setup_dummy: cannot attach to a real client at %s: %s", address, exc)
        return E.INTERNAL_ERROR
    conn.client = cast(Any, remote)
    conn.local_buffer = NO_LIMIT
    conn.hostname = ""
    return 0


def dummy_parts(plain: Parts, conn: Conn, registered: dict[int, int]) -> Parts:
    """The store's parts while attached: the plain ones with the dummy's five in place (the
    segment and tensor parts run unchanged over the RemoteClient)."""
    return dataclasses.replace(
        plain,
        life=DummyLifecycle(conn, registered),
        kv=DummyKv(conn),
        ptr=DummyPointers(conn, registered),
        sessions=DummySessions(conn),
        replicas=DummyReplicas(conn),
    )


def _remote(conn: Conn) -> RemoteClient:
    return cast(RemoteClient, conn.client)


class DummyLifecycle(Lifecycle):
    """A dummy is never set up as a real client; it attaches once (the store's setup_dummy) and
    detaches on close (the real client then unmaps its memory)."""

    def setup(self, *args: Any, **kwargs: Any) -> int:
        return E.INTERNAL_ERROR  # a dummy is never set up as a real client (the wheel: -1)

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int) -> int:
        check_signature(protocol, device_name, mount_segment_size, kinds=(str, str, int))
        return E.INTERNAL_ERROR

    def health_check(self) -> int:
        return 1 if self._conn.client is None else 2  # the wheel's dummy answers 2, attached or not

    def alloc_from_mem_pool(self, size: int) -> int:
        check_signature(size, kinds=(int,))
        if self._conn.client is None:
            return 0
        try:
            return _remote(self._conn).alloc(size)
        except (KvcakeError, OSError) as exc:
            log.error("alloc_from_mem_pool(%d): %s", size, exc)
            return 0


class DummyPointers(PointerOps):
    """Registration only of whole ``alloc_from_mem_pool`` blocks; pointer calls only on
    registered memory (the wheel: -600). The real client reads and writes that memory in place;
    the table of registered blocks is the RemoteClient's, mirrored in the store's."""

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Only a whole ``alloc_from_mem_pool`` block (the wheel: -1 otherwise)."""
        check_signature(buffer_ptr, size, kinds=(int, int))
        seg = _remote(self._conn).segs.at(buffer_ptr) if self._conn.client is not None else None
        if seg is None or seg[1] != size:
            return E.INTERNAL_ERROR
        _remote(self._conn).segs.registered.add(seg[0])
        self._registered[buffer_ptr] = size
        return 0

    def unregister_buffer(self, buffer_ptr: int) -> int:
        check_signature(buffer_ptr, kinds=(int,))
        remote = _remote(self._conn) if self._conn.client is not None else None
        seg = remote.segs.at(buffer_ptr) if remote is not None else None
        if remote is None or seg is None or seg[0] not in remote.segs.registered:
            return E.INTERNAL_ERROR
        remote.segs.registered.discard(seg[0])
        self._registered.pop(buffer_ptr, None)
        return 0

    def _outside(self, ptrs: list[Any], sizes: list[Any]) -> bool:
        remote = _remote(self._conn)
        return any(
            not (isinstance(p, int) and isinstance(n, int) and remote.segs.find(p, n) is not None)
            for p, n in zip(ptrs, sizes, strict=False)
        )

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


class DummyKv(KvOps):
    """The reads the plain part runs on the kvcake client's internals go through the
    RemoteClient's ``get_bytes`` (one copy out of shared memory into fresh ``bytes``)."""

    @returns(b"")
    def get(self, key: str) -> bytes:
        check_key(key)
        got = _remote(self._conn).get_bytes([key])[0] if key else b""
        return b"" if isinstance(got, StoreError) else got

    def get_batch(self, keys: list[str]) -> list[bytes]:
        if not isinstance(keys, list):
            raise TypeError("keys must be a list of str")
        if self._conn.client is None or not keys:
            return [b""] * max(len(keys), 1)
        try:
            got = _remote(self._conn).get_bytes(keys)
        except KvcakeError:
            return [b""] * len(keys)
        return [b"" if isinstance(g, StoreError) else g for g in got]

    def is_exist(self, key: str) -> int:
        """1, 0, or the error code (the wheel's dummy answers -900 once the real client is gone)."""
        check_key(key)
        if self._conn.client is None or not key:
            return -1
        try:
            return int(_remote(self._conn).is_exist(key))
        except StoreError as exc:
            return exc.code
        except KvcakeError:
            return -1


class DummyReplicas(Replicas):
    """Replica descriptors and copy / move tasks are not forwarded by a dummy (the wheel's
    answers); clearing and task queries run as the plain part's."""

    def get_replica_desc(self, key: str) -> list[Any]:
        check_key(key)
        return []

    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[Any]]:
        return {}

    def create_copy_task(self, key: str, targets: list[str]) -> tuple[tuple[int, int], int]:
        return (0, 0), E.INVALID_PARAMS

    def create_move_task(self, key: str, source: str, target: str) -> tuple[tuple[int, int], int]:
        return (0, 0), E.INVALID_PARAMS


class DummySessions(Sessions):
    """Sessions need the master connection a dummy does not have (the wheel's dummy: -600); its
    session tables stay empty, so the range calls answer -600 for every key as well."""

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
