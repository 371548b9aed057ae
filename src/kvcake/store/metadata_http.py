"""Mooncake's HTTP metadata protocol on the master (what ``mooncake_http_metadata_server`` and
``mooncake_master --enable_http_metadata_server`` serve), as a view onto the master's directory.

``GET /metadata?key=K`` answers the stored bytes (200) or ``metadata not found`` (404);
``PUT /metadata?key=K`` stores the raw body (200 ``metadata updated``); ``DELETE`` removes it
(200 ``metadata deleted``, also for a missing key), all with Mooncake's content type. Keys under
``kvcake/segments/`` are a read-only view of the Transfer Engine directory (JSON of each entry;
``kvcake/segments/`` alone lists the names), so a Mooncake-style client sees kvcake's segments
where it looks for metadata. Bounded: ``max_keys`` keys, ``max_value`` bytes per value (507 and
413 beyond, with a message); a key must be 1-4096 characters (400).
"""

from __future__ import annotations

import threading

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response

from kvcake.transfer.metadata import DirectoryBackend

CONTENT_TYPE = "application/json; charset=utf-8"
VIEW_PREFIX = "kvcake/segments/"


class MetadataKV:
    """The flat key -> bytes map behind the endpoints (thread-safe)."""

    def __init__(
        self,
        directory: DirectoryBackend | None = None,
        max_keys: int = 65536,
        max_value: int = 1 << 20,
    ):
        self.directory = directory
        self.max_keys = max_keys
        self.max_value = max_value
        self._lock = threading.Lock()
        self._data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        if key.startswith(VIEW_PREFIX):
            return self._view(key[len(VIEW_PREFIX) :])
        with self._lock:
            return self._data.get(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def _view(self, name: str) -> bytes | None:
        if self.directory is None:
            return None
        if not name:
            return msgspec.json.encode(sorted(e.name for e in self.directory.list()))
        entry = self.directory.get(name)
        return None if entry is None else msgspec.json.encode(entry)

    def put(self, key: str, value: bytes) -> None:
        """Raises PermissionError (view key), OverflowError (too many keys)."""
        if key.startswith(VIEW_PREFIX):
            raise PermissionError(f"keys under {VIEW_PREFIX!r} are a read-only directory view")
        with self._lock:
            if key not in self._data and len(self._data) >= self.max_keys:
                raise OverflowError(f"metadata store is full ({self.max_keys} keys)")
            self._data[key] = value

    def delete(self, key: str) -> None:
        if key.startswith(VIEW_PREFIX):
            raise PermissionError(f"keys under {VIEW_PREFIX!r} are a read-only directory view")
        with self._lock:
            self._data.pop(key, None)


def metadata_router(kv: MetadataKV) -> APIRouter:
    router = APIRouter()

    def reply(status: int, body: bytes | str) -> Response:
        data = body.encode() if isinstance(body, str) else body
        return Response(data, status_code=status, media_type=CONTENT_TYPE)

    def bad_key(key: str) -> Response | None:
        if not key or len(key) > 4096:
            return reply(400, "invalid request: need ?key= (1-4096 characters)")
        return None

    @router.get("/metadata")
    def get_metadata(key: str = "") -> Response:
        if (bad := bad_key(key)) is not None:
            return bad
        value = kv.get(key)
        return reply(404, "metadata not found") if value is None else reply(200, value)

    @router.put("/metadata")
    async def put_metadata(request: Request, key: str = "") -> Response:
        if (bad := bad_key(key)) is not None:
            return bad
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > kv.max_value:
                return reply(413, f"metadata value larger than {kv.max_value} bytes")
        try:
            kv.put(key, bytes(body))
        except PermissionError as exc:
            return reply(403, str(exc))
        except OverflowError as exc:
            return reply(507, str(exc))
        return reply(200, "metadata updated")

    @router.delete("/metadata")
    def delete_metadata(key: str = "") -> Response:
        if (bad := bad_key(key)) is not None:
            return bad
        try:
            kv.delete(key)
        except PermissionError as exc:
            return reply(403, str(exc))
        return reply(200, "metadata deleted")

    return router
