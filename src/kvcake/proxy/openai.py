"""OpenAI request parsing (docs/serve.md has the compatibility table). Pure functions: a decoded
body either becomes a validated :class:`GenRequest` or raises :class:`BadRequest` (HTTP 400) /
:class:`ModelNotFound` (HTTP 404). Nothing is accepted and ignored: a parameter kvcake does not
implement is a 400 unless its value is the one that changes nothing (``echo: false``...).
Response shapes live in :mod:`kvcake.proxy.openai_shapes`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcake.core.api import SamplingParams
from kvcake.core.errors import KvcakeError
from kvcake.serve.wire import BadRequest

MAX_STOP = 4
MAX_TEMPERATURE = 2.0


class ModelNotFound(KvcakeError):
    """The body names a model the proxy does not serve (HTTP 404, vLLM's wording)."""

    def __init__(self, model: str):
        super().__init__(f"The model `{model}` does not exist.")


# Parameters that are not implemented, with the values that mean "not used" (accepted); any
# other value is a 400 naming the parameter. (None is always accepted: JSON null = absent.)
_NOOP: dict[str, tuple[Any, ...]] = {
    "echo": (False,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "best_of": (1,),
    "top_logprobs": (0,),
    "tools": ([],),
    "tool_choice": ("none",),
    "parallel_tool_calls": (),
    "response_format": ({"type": "text"},),
    "suffix": ("",),
}
_METADATA = {"user"}  # any string: an end-user id, recorded nowhere, changes nothing
_COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stream", "stream_options",
           "stop", "stop_token_ids", "ignore_eos", "n", "logprobs", "presence_penalty",
           "frequency_penalty", "logit_bias", "user", "cache_salt"}  # fmt: skip
_CHAT_ONLY = {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
              "parallel_tool_calls", "response_format"}  # fmt: skip
_COMPLETION_ONLY = {"prompt", "echo", "best_of", "suffix"}
KNOWN = {True: _COMMON | _CHAT_ONLY, False: _COMMON | _COMPLETION_ONLY}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class GenRequest:
    chat: bool
    prompt_text: str | None  # completions with a string prompt
    prompt_ids: tuple[int, ...] | None  # completions with token ids
    messages: tuple[dict[str, str], ...]  # chat
    max_tokens: int | None  # None: up to the rest of the model's context
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    stream: bool
    include_usage: bool
    model: str  # the name the client used (or the default name)
    cache_salt: str = ""  # vLLM's: requests of other salts never reuse this one's KV

    def sampling(self, prompt_len: int, context: int) -> SamplingParams:
        """The engine's parameters once the prompt length is known."""
        room = context - prompt_len
        if room < 1:
            raise BadRequest(
                f"the prompt ({prompt_len} tokens) leaves no room in the model context of "
                f"{context} tokens"
            )
        max_tokens = room if self.max_tokens is None else self.max_tokens
        if max_tokens > room:
            raise BadRequest(
                f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) exceeds the model "
                f"context of {context} tokens"
            )
        return SamplingParams(
            max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
            seed=self.seed, stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos,
        )  # fmt: skip


def _num(body: dict[str, Any], key: str, tp: type, default: Any) -> Any:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise BadRequest(f"'{key}' must be a number, got {v!r}")
    if tp is int and not float(v).is_integer():
        raise BadRequest(f"'{key}' must be an integer, got {v!r}")
    return tp(v)


def _bool(body: dict[str, Any], key: str) -> bool:
    v = body.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise BadRequest(f"'{key}' must be a boolean, got {v!r}")
    return v


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be a string or a list of text parts")
    parts = []
    for j, p in enumerate(content):
        if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
            raise BadRequest(f"{where}.content[{j}] must be {{'type': 'text', 'text': str}} "
                             "(only text content is supported)")  # fmt: skip
        parts.append(p["text"])
    return "".join(parts)


def _messages(raw: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(f"{where} needs a role of {', '.join(ROLES)}")
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise BadRequest(f"{where}: unsupported field(s) {', '.join(sorted(extra))}")
        if m.get("name") is not None and not isinstance(m["name"], str):
            raise BadRequest(f"{where}.name must be a string")
        out.append({"role": ROLES[m["role"]], "content": _text_of(m.get("content"), where)})
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
    raise BadRequest("'prompt' must be a non-empty string or a list of token ids "
                     "(a batch of several prompts is not supported)")  # fmt: skip


def _stop(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise BadRequest("'stop' must be a non-empty string or a list of non-empty strings")
    if len(items) > MAX_STOP:
        raise BadRequest(f"'stop' takes at most {MAX_STOP} strings, got {len(items)}")
    return tuple(dict.fromkeys(items))


def _reject_unimplemented(body: dict[str, Any]) -> None:
    for key in sorted(set(body) & set(_NOOP)):
        v, ok = body[key], _NOOP[key]
        if v is None:
            continue
        if isinstance(v, bool) and False not in ok:
            raise BadRequest(f"'{key}' is not supported (got {v!r})")
        if v not in ok:
            raise BadRequest(f"'{key}' is not supported (got {v!r}); omit it")
    for key in sorted(set(body) & _METADATA):
        if body[key] is not None and not isinstance(body[key], str):
            raise BadRequest(f"'{key}' must be a string")
    lp = body.get("logprobs")
    if lp is not None and lp is not False:  # chat: a bool; completions: an int (any = asked)
        raise BadRequest("'logprobs' is not supported; omit it")


def _max_tokens(body: dict[str, Any], chat: bool) -> int | None:
    newer = chat and body.get("max_completion_tokens") is not None
    key = "max_completion_tokens" if newer else "max_tokens"
    n = _num(body, key, int, None)
    if n is not None and n < 1:
        raise BadRequest(f"'{key}' must be >= 1, got {n}")
    return n


def parse(body: Any, *, chat: bool, vocab_size: int, models: tuple[str, ...]) -> GenRequest:
    """Validate a decoded body. ``models``: the served names (the first is the default)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = sorted(set(body) - KNOWN[chat])
    if unknown:
        raise BadRequest(f"unsupported field(s): {', '.join(unknown)}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    if model and model not in models:
        raise ModelNotFound(model)
    _reject_unimplemented(body)
    if body.get("n") not in (None, 1):
        raise BadRequest("only n=1 is supported")
    text, ids = None, None
    msgs: tuple[dict[str, str], ...] = ()
    if chat:
        msgs = _messages(body.get("messages"))
    else:
        if "prompt" not in body:
            raise BadRequest("'prompt' is required")
        text, ids = _prompt(body["prompt"], vocab_size)
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(type(t) is int for t in stop_ids):
        raise BadRequest("'stop_token_ids' must be a list of integers")
    temperature = _num(body, "temperature", float, 1.0)
    if not 0 <= temperature <= MAX_TEMPERATURE:
        raise BadRequest(f"'temperature' must be in [0, {MAX_TEMPERATURE}], got {temperature}")
    top_p = _num(body, "top_p", float, 1.0)
    if not 0 < top_p <= 1:
        raise BadRequest(f"'top_p' must be in (0, 1], got {top_p}")
    opts = body.get("stream_options")
    if opts is not None and (not isinstance(opts, dict) or set(opts) - {"include_usage"}):
        raise BadRequest("'stream_options' supports only {'include_usage': bool}")
    return GenRequest(
        chat=chat, prompt_text=text, prompt_ids=ids, messages=msgs,
        max_tokens=_max_tokens(body, chat), temperature=temperature, top_p=top_p,
        seed=_num(body, "seed", int, None), stop=_stop(body.get("stop")),
        stop_token_ids=tuple(stop_ids), ignore_eos=_bool(body, "ignore_eos"),
        stream=_bool(body, "stream"), include_usage=_bool(opts or {}, "include_usage"),
        model=model or models[0], cache_salt=_cache_salt(body.get("cache_salt")),
    )  # fmt: skip


def _cache_salt(v: Any) -> str:
    """vLLM's ``cache_salt``: a non-empty string (at most 256 characters here)."""
    if v is None:
        return ""
    if not isinstance(v, str) or not v or len(v) > 256:
        raise BadRequest("'cache_salt' must be a non-empty string of at most 256 characters")
    return v
