"""OpenAI response shapes: completions, chat completions, their SSE chunks, errors, model cards.
One :class:`ResponseMeta` per request fixes the id (``cmpl-`` / ``chatcmpl-``) and ``created``
for the response or for every chunk of its stream."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from kvcake.core.api import FinishReason


@dataclass(frozen=True)
class ResponseMeta:
    chat: bool
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            prefix = "chatcmpl-" if self.chat else "cmpl-"
            object.__setattr__(self, "id", prefix + uuid.uuid4().hex)


def finish_reason(reason: FinishReason | None) -> str | None:
    if reason is None:
        return None
    return {FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}.get(reason, reason.value)


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def response(
    meta: ResponseMeta, text: str, reason: str | None, use: dict[str, Any]
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
    if meta.chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": meta.id,
        "object": "chat.completion" if meta.chat else "text_completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "usage": use,
    }


def chunk(
    meta: ResponseMeta, text: str | None, reason: str | None, first: bool = False
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
    if meta.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    return {
        "id": meta.id,
        "object": "chat.completion.chunk" if meta.chat else "text_completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
    }


def usage_chunk(meta: ResponseMeta, use: dict[str, Any]) -> dict[str, Any]:
    c = chunk(meta, None, None)
    c["choices"] = []
    c["usage"] = use
    return c


def model_card(name: str, root: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "kvcake", "root": root}


# Kinds that are OpenAI's generic categories carry no more specific code (``code`` null, as
# OpenAI answers a malformed body); every other kind is its own code (``model_not_found``,
# ``ttft_slo``...), a string as OpenAI's SDKs expect.
_GENERIC = {"invalid_request_error", "not_found_error", "server_error"}
_STATUS_KIND = {400: "invalid_request_error", 404: "not_found_error",
                405: "invalid_request_error", 422: "invalid_request_error"}  # fmt: skip


def error(message: str, kind: str, status: int = 0, param: str | None = None,
          code: str | None = None) -> dict[str, Any]:  # fmt: skip
    """OpenAI's error body: ``message``, ``type``, ``param``, ``code`` (a string or null).
    ``status`` is the HTTP status it goes with (the body does not repeat it)."""
    del status
    if code is None and kind not in _GENERIC:
        code = kind
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def install_error_handlers(app: Any) -> None:
    """Every error the framework itself answers (unknown path 404, wrong method 405, ...)
    in the same shape, never FastAPI's ``{"detail": ...}``."""

    async def http_error(_: Any, exc: Any) -> Any:
        status = int(exc.status_code)
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        kind = _STATUS_KIND.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        code = {404: "not_found", 405: "method_not_allowed"}.get(status)
        body = error(detail, kind, status, code=code)
        return JSONResponse(body, status_code=status, headers=getattr(exc, "headers", None))

    async def invalid(_: Any, exc: Any) -> Any:
        return JSONResponse(error(str(exc), "invalid_request_error", 400), status_code=400)

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
