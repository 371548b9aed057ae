"""Turning text into token ids and back, in the proxy (chat template and tokenization happen
there, so block keys are computed once, from the tokens the instances will see).

* :class:`ModelCodec` — the real model's tokenizer and chat template (``kvcake.engine``).
* :class:`ByteCodec` — for the emulated backend, which has no vocabulary: UTF-8 bytes map to ids
  ``256 + byte``; other ids render as ``<id>``. Token-id prompts (``replay``) need no codec.

Streaming text (and ``stop`` strings) is :mod:`kvcake.proxy.detok`'s job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvcake.core.errors import EngineError
from kvcake.engine.config import cache_root
from kvcake.engine.model.tokenizer import TextTokenizer
from kvcake.engine.model.weights import resolve_checkpoint

BYTE_BASE = 256
_NOGIL_CHARS = 16_384  # longer texts are tokenized without holding the GIL


class TextCodec(Protocol):
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    # The most characters one token stands for: a text of n characters is at least
    # n / max_token_chars tokens, so a prompt too long for the context can be refused untokenized.
    max_token_chars: int

    def encode(self, text: str) -> list[int]: ...

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteCodec:
    def __init__(self, vocab_size: int, eos_token_ids: tuple[int, ...] = ()):
        if vocab_size < BYTE_BASE + 256:
            raise EngineError(f"vocab_size {vocab_size} too small for byte tokens")
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.max_token_chars = 1  # one token per UTF-8 byte

    def encode(self, text: str) -> list[int]:
        return [BYTE_BASE + b for b in text.encode("utf-8")]

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>"
        return self.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        out, buf = [], bytearray()
        for t in ids:
            if BYTE_BASE <= t < BYTE_BASE + 256:
                buf.append(t - BYTE_BASE)
                continue
            if buf:
                out.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
            out.append(f"<{t}>")
        if buf:
            out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


class ModelCodec:
    def __init__(self, model: str = "smollm2", cache_dir: str = ""):
        self._tok = TextTokenizer(resolve_checkpoint(model, cache_root(cache_dir)))
        self.vocab_size = self._tok.vocab_size
        eos = self._tok.eos_token_id
        self.eos_token_ids = (eos,) if eos is not None else ()
        self.max_token_chars = max(
            1,
            *(
                len(self._tok.decode([i], skip_special_tokens=False))
                for i in range(self.vocab_size)
            ),
        )

    def encode(self, text: str) -> list[int]:
        if len(text) < _NOGIL_CHARS:
            return self._tok.encode(text)
        ids = self._encode_nogil(text)
        if self._tok.add_bos and self._tok.bos_token_id is not None:
            ids.insert(0, self._tok.bos_token_id)
        return ids

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        if sum(len(m["content"]) for m in messages) < _NOGIL_CHARS:
            return self._tok.encode_chat(messages)
        return self._encode_nogil(self._tok.apply_chat_template(messages))

    def _encode_nogil(self, text: str) -> list[int]:
        """``tokenizers``' single ``encode`` holds the GIL throughout (a 1 MB prompt stalled
        the proxy's event loop for seconds, measured); ``encode_batch`` releases it. Same ids."""
        raw = self._tok._tok  # the tokenizers.Tokenizer behind the engine's TextTokenizer
        return list(raw.encode_batch([text], add_special_tokens=False)[0].ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(ids)
