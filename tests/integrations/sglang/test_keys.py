"""Page keys of the SGLang backend (pure logic, main venv)."""

from __future__ import annotations

import pytest

from kvcake.integrations.sglang.keys import PageLayoutError, PageNamer

H = "ab" * 32


def test_key_names_model_format_and_rank() -> None:
    fmt = PageNamer.format_part("bfloat16", "page_first_direct", 64, 4096)
    namer = PageNamer(PageNamer.model_part("Qwen/Qwen3-8B"), tp_rank=1, tp_size=4, fmt=fmt)
    assert namer.key(H) == f"sglang/Qwen--Qwen3-8B/bfloat16/page_first/p64/4096B/{H}/tp1of4"
    pp = PageNamer("m", tp_rank=0, tp_size=1, pp_rank=1, pp_size=2, fmt=fmt)
    assert pp.key(H).endswith(f"{H}/pp1of2/tp0of1")


def test_mla_pages_are_shared_by_ranks() -> None:
    a = PageNamer("m", tp_rank=0, tp_size=2, is_mla=True)
    b = PageNamer("m", tp_rank=1, tp_size=2, is_mla=True)
    assert a.key(H) == b.key(H) == f"sglang/m/raw/{H}"


def test_layouts_with_other_bytes_get_other_keys() -> None:
    names = {PageNamer.format_part("float16", lay, 16, 512)
             for lay in ("layer_first", "page_first", "page_head")}  # fmt: skip
    assert len(names) == 3


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 300, "a b"])
def test_bad_page_hash_is_refused(bad: str) -> None:
    with pytest.raises(PageLayoutError):
        PageNamer("m").key(bad)


def test_unknown_layout_and_bad_ranks_are_refused() -> None:
    with pytest.raises(PageLayoutError, match="not supported"):
        PageNamer.format_part("float16", "head_first", 16, 512)
    with pytest.raises(PageLayoutError):
        PageNamer("m", tp_rank=2, tp_size=2)
