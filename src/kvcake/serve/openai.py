"""OpenAI request parsing and response shapes (ecosystem.md). Pure functions: a body either
becomes a validated :class:`GenRequest` or raises :class:`BadRequest` (HTTP 400)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kvcake.core.api import FinishReason, SamplingParams
from kvcake.serve.wire import BadRequest

_KNOWN = {
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "seed", "stream", "stop", "stop_token_ids", "ignore_eos", "n", "user",
    "stream_options", "frequency_penalty", "presence_penalty", "logprobs", "echo",
}  # fmt: skip


@dataclass(frozen=True)
class GenRequest:
    chat: bool
    prompt_text: str | None  # completions with a string prompt
    prompt_ids: tuple[int, ...] | None  # completions with token ids
    messages: tuple[dict[str, str], ...]  # chat
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    model: str


def _num(body: dict[str, Any], key: str, tp: type, default: Any) -> Any:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise BadRequest(f"'{key}' must be a number, got {v!r}")
    if tp is int and not float(v).is_integer():
        raise BadRequest(f"'{key}' must be an integer, got {v!r}")
    return tp(v)


def _messages(raw: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise BadRequest(f"messages[{i}] needs a role of system, user or assistant")
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string")
        out.append({"role": str(m["role"]), "content": content})
    return tuple(out)


def _prompt(raw: Any, vocab_size: int) -> tuple[str | None, tuple[int, ...] | None]:
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str | list):
        raw = raw[0]  # a batch of one
    if isinstance(raw, str):
        if not raw:
            raise BadRequest("'prompt' must not be empty")
        return raw, None
    if isinstance(raw, list) and raw and all(type(t) is int for t in raw):
        bad = [t for t in raw if not 0 <= t < vocab_size]
        if bad:
            raise BadRequest(f"token id {bad[0]} outside the vocabulary [0, {vocab_size})")
        return None, tuple(raw)
    raise BadRequest("'prompt' must be a non-empty string or a list of token ids")


def parse(body: Any, *, chat: bool, vocab_size: int, max_tokens_cap: int) -> GenRequest:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise BadRequest(f"unsupported field(s): {', '.join(unknown)}")
    if body.get("n", 1) != 1:
        raise BadRequest("only n=1 is supported")
    text, ids = None, None
    msgs: tuple[dict[str, str], ...] = ()
    if chat:
        msgs = _messages(body.get("messages"))
    else:
        if "prompt" not in body:
            raise BadRequest("'prompt' is required")
        text, ids = _prompt(body["prompt"], vocab_size)
    max_tokens = _num(body, "max_completion_tokens", int, None) or _num(body, "max_tokens", int, 16)
    stop_ids = body.get("stop_token_ids") or ()
    if not isinstance(stop_ids, list | tuple) or not all(type(t) is int for t in stop_ids):
        raise BadRequest("'stop_token_ids' must be a list of integers")
    if not isinstance(body.get("stream", False), bool):
        raise BadRequest("'stream' must be a boolean")
    if not 1 <= max_tokens <= max_tokens_cap:
        raise BadRequest(f"'max_tokens' must be in [1, {max_tokens_cap}], got {max_tokens}")
    try:
        sampling = SamplingParams(
            max_tokens=max_tokens,
            temperature=_num(body, "temperature", float, 1.0),
            top_p=_num(body, "top_p", float, 1.0),
            seed=_num(body, "seed", int, None),
            stop_token_ids=tuple(stop_ids),
            ignore_eos=bool(body.get("ignore_eos", False)),
        )
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    opts = body.get("stream_options") or {}
    return GenRequest(
        chat=chat,
        prompt_text=text,
        prompt_ids=ids,
        messages=msgs,
        sampling=sampling,
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
        model=str(body.get("model") or ""),
    )


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
    rid: str, chat: bool, model: str, text: str, reason: str | None, use: dict[str, Any]
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": use,
    }


def chunk(
    rid: str, chat: bool, model: str, text: str | None, reason: str | None, first: bool = False
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
    if chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }


def error(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code}}
