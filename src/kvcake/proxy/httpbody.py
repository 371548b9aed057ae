"""Request bodies in the proxy: a size limit checked before anything is parsed, and strict JSON.

``413`` comes from ``Content-Length`` alone when it is declared (nothing is read), otherwise as
soon as the bytes read so far exceed the limit. JSON is decoded by msgspec, which refuses what
Python's ``json`` lets through into the server: bytes that are not UTF-8, lone surrogate
escapes (``"\\ud800"``, which no codec can encode later), ``NaN`` / ``Infinity``, numbers beyond
a float; nesting deeper than the interpreter can recurse is caught too. Every one is a 400.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request

from kvcake.core.errors import KvcakeError
from kvcake.serve.wire import BadRequest


class BodyTooLarge(KvcakeError):
    """The request body exceeds ``proxy.max_body_bytes`` (HTTP 413)."""

    def __init__(self, size: int | None, limit: int):
        got = f"{size} bytes" if size is not None else "more"
        super().__init__(
            f"the request body ({got}) exceeds the limit of {limit} bytes (proxy.max_body_bytes)"
        )


async def read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError as exc:
            raise BadRequest(f"bad Content-Length {declared!r}") from exc
        if size > limit:
            raise BodyTooLarge(size, limit)
    buf = bytearray()
    async for piece in request.stream():
        buf += piece
        if len(buf) > limit:
            raise BodyTooLarge(None, limit)
    return bytes(buf)


def decode_json(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except RecursionError as exc:
        raise BadRequest("the body is not valid JSON: nested too deeply") from exc
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        msg = str(exc)
        if "truncated" in msg or "UTF-8" in msg:
            msg += " (invalid UTF-8 or a lone surrogate escape?)"
        raise BadRequest(f"the body is not valid JSON: {msg}") from exc
