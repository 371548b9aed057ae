"""Pool keys of SGLang HiCache pages (pure logic: no sglang import, tested in the main venv).

SGLang names a page by a SHA-256 hex chained over the previous page's hash and the page's
tokens; its own backends append the model and the rank that wrote it (SGLang's ``MooncakeStore``
stores ``{hash}_{rank}_k`` / ``_v``, ``HiCacheFile`` ``{hash}_{model}_{rank}_{size}``). kvcake's
key says everything that changes the page's bytes, so two workers share a page exactly when its
bytes are interchangeable, and nothing else can ever be read into a host pool:
``sglang/{model}/{dtype}/{layout}/p{page_size}/{page_bytes}B/{hash}[/pp{r}of{n}][/tp{r}of{n}]``.
MLA pages (keys only) are the same on every TP rank, so they carry no TP part (SGLang's own
backends share them too). ``page_first_direct`` stores the same bytes as ``page_first``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvcake.core.hashing import rank_key

# Host layouts whose pages SGLang's get_page_buffer_meta describes; the bytes of a page differ
# between them (token-major vs layer-major vs head-major), so the layout is part of the key.
LAYOUTS = {
    "layer_first": "layer_first",
    "page_first": "page_first",
    "page_first_direct": "page_first",
    "page_head": "page_head",
}
_HASH = re.compile(r"[0-9A-Za-z_.:-]{1,256}")
_MODEL_BAD = re.compile(r"[^0-9A-Za-z_.-]+")


class PageLayoutError(ValueError):
    """A host pool, page or call this backend cannot serve without risking wrong KV."""


@dataclass(frozen=True)
class PageNamer:
    model: str
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    is_mla: bool = False
    fmt: str = "raw"  # "{dtype}/{layout}/p{page}/{bytes}B" once the host pool is known

    def __post_init__(self) -> None:
        if not 0 <= self.tp_rank < self.tp_size or not 0 <= self.pp_rank < self.pp_size:
            raise PageLayoutError(
                f"rank outside its group: tp {self.tp_rank}/{self.tp_size}, "
                f"pp {self.pp_rank}/{self.pp_size}"
            )

    @staticmethod
    def model_part(model: str | None) -> str:
        """A model name as one key component ("org/name" -> "org--name")."""
        return _MODEL_BAD.sub("--", model or "unnamed").strip("-") or "unnamed"

    @staticmethod
    def format_part(dtype: str, layout: str, page_size: int, page_bytes: int) -> str:
        if layout not in LAYOUTS:
            raise PageLayoutError(
                f"host layout {layout!r} is not supported (supported: {sorted(LAYOUTS)})"
            )
        if page_size < 1 or page_bytes < 1:
            raise PageLayoutError(f"page of {page_size} tokens / {page_bytes} bytes")
        return f"{dtype}/{LAYOUTS[layout]}/p{page_size}/{page_bytes}B"

    def key(self, page_hash: str) -> str:
        if not isinstance(page_hash, str) or not _HASH.fullmatch(page_hash):
            raise PageLayoutError(f"page key {str(page_hash)[:80]!r} is not a page hash")
        key = f"sglang/{self.model}/{self.fmt}/{page_hash}"
        if self.pp_size > 1:
            key += f"/pp{self.pp_rank}of{self.pp_size}"
        return key if self.is_mla else rank_key(key, self.tp_rank, self.tp_size)

    def keys(self, page_hashes: list[str]) -> list[str]:
        return [self.key(h) for h in page_hashes]
