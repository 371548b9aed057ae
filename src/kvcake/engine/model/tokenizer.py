"""Tokenizer and chat template.

From a GGUF we rebuild a Hugging Face ``tokenizers`` byte-level BPE (vocabulary, merges, special
tokens; SmolLM's pre-tokenizer splits digits individually, as llama.cpp's ``smollm`` pre-type
does). The chat template (Jinja) comes from the GGUF metadata and is rendered like transformers'
``apply_chat_template`` (sandboxed, ``trim_blocks``/``lstrip_blocks``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvcake.core.errors import EngineError

_CONTROL = 3  # llama.cpp token type of special/control tokens
_DIGIT_SPLITTING_PRE = {"smollm", "llama3", "llama-bpe", "deepseek-llm"}


def tokenizer_files_from_gguf(reader: Any) -> tuple[str, dict[str, Any]]:
    """``(tokenizer.json text, tokenizer_config dict)`` for a GGUF with a ``gpt2`` tokenizer."""
    # lazy: optional dependency (tokenizers)
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    def field(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    if field("tokenizer.ggml.model") != "gpt2":
        raise EngineError("only byte-level BPE (gpt2-style) GGUF tokenizers are supported")
    tokens: list[str] = field("tokenizer.ggml.tokens")
    types: list[int] = field("tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if field("tokenizer.ggml.pre", "") in _DIGIT_SPLITTING_PRE:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    specials = [t for t, ty in zip(tokens, types, strict=False) if ty == _CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])

    def name(key: str) -> str | None:
        i = field(key)
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id"),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
        "unk_token": name("tokenizer.ggml.unknown_token_id"),
        "add_bos_token": bool(field("tokenizer.ggml.add_bos_token", False)),
        "chat_template": field("tokenizer.chat_template"),
        "model_max_length": int(field("llama.context_length", 2048)),
    }
    return tok.to_str(), cfg


class TextTokenizer:
    """Encode/decode text and render chat messages for one checkpoint directory."""

    def __init__(self, ckpt_dir: Path) -> None:
        # lazy: optional dependency (tokenizers)
        from tokenizers import Tokenizer

        path = ckpt_dir / "tokenizer.json"
        if not path.is_file():
            raise EngineError(f"{ckpt_dir} has no tokenizer.json")
        self._tok = Tokenizer.from_file(str(path))
        cfg_path = ckpt_dir / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        self.chat_template: str | None = self.config.get("chat_template")
        self.add_bos = bool(self.config.get("add_bos_token", False))
        self.bos_token_id = self._id(self.config.get("bos_token"))
        self.eos_token_id = self._id(self.config.get("eos_token"))

    def _id(self, token: Any) -> int | None:
        if isinstance(token, dict):
            token = token.get("content")
        return None if token is None else self._tok.token_to_id(str(token))

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())

    def encode(self, text: str) -> list[int]:
        ids = list(self._tok.encode(text, add_special_tokens=False).ids)
        if self.add_bos and self.bos_token_id is not None:
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        if not self.chat_template:
            raise EngineError("this model has no chat template; pass a plain prompt")
        # lazy: optional dependency (jinja2)
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        for m in messages:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise EngineError("chat messages must be dicts with 'role' and 'content'")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.chat_template).render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.config.get("bos_token") or "",
            eos_token=self.config.get("eos_token") or "",
        )

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Chat messages → prompt token ids (special tokens in the template are parsed)."""
        text = self.apply_chat_template(messages)
        return list(self._tok.encode(text, add_special_tokens=False).ids)
