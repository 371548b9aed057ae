"""OpenAI response shapes: completions, chat completions, their SSE chunks, errors, model cards.
One :class:`ResponseMeta` per request fixes the id (``cmpl-`` / ``chatcmpl-``) and ``created``
for the response or for every chunk of its stream."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

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


def error(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code}}
