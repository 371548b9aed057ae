"""The one incremental detokenizer: streamed pieces add up to the full decode, characters split
over tokens are sent whole, and stop strings cut exactly where a token-by-token check would."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcake.proxy.detok import Detokenizer
from kvcake.proxy.textcodec import ByteCodec

CODEC = ByteCodec(1024)
TEXT = "Hello wörld — naïve café 😀 日本語 end\n\nmore"


def _stream(codec: object, ids: list[int], stop: tuple[str, ...], step: int = 1) -> Detokenizer:
    d = Detokenizer(codec, stop)  # type: ignore[arg-type]
    pieces = []
    for i in range(0, len(ids), step):
        pieces.append(d.feed(ids[i : i + step]))
        assert "\ufffd" not in pieces[-1]  # never half a character
        if d.stopped:
            break
    pieces.append(d.finish())
    assert "".join(pieces) == d.text
    return d


def _reference(text: str, stop: tuple[str, ...]) -> str:
    """Grow the text one character at a time; cut at the first stop string seen."""
    for n in range(1, len(text) + 1):
        hits = [i for i in (text[:n].find(s) for s in stop) if i >= 0]
        if hits:
            return text[: min(hits)]
    return text


def test_split_characters_and_no_stop() -> None:
    d = _stream(CODEC, CODEC.encode(TEXT), ())
    assert d.text == TEXT and not d.stopped


def test_stop_cuts_and_counts_the_completing_token() -> None:
    ids = CODEC.encode(TEXT)
    d = _stream(CODEC, ids, ("\n\n",), step=3)
    assert d.stopped and d.text == TEXT[: TEXT.index("\n\n")]
    # chunks of 3 tokens: only the tokens up to the one completing "\n\n" are consumed
    assert len(d.ids) == len(TEXT[: TEXT.index("\n\n") + 2].encode())


def test_held_back_prefix_is_released_when_it_is_not_a_stop() -> None:
    d = Detokenizer(CODEC, ("café!",))
    assert d.feed(CODEC.encode("naïve ca")) == "naïve "  # "ca" might start "café!"
    assert d.feed(CODEC.encode("fé")) == ""
    assert d.feed(CODEC.encode(" x")) == "café x"
    assert d.finish() == "" and not d.stopped


def test_empty_stop_is_refused() -> None:
    with pytest.raises(ValueError):
        Detokenizer(CODEC, ("",))


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab\n é😀", max_size=40),
    stop=st.lists(st.text(alphabet="ab\n é😀", min_size=1, max_size=4), max_size=4),
    step=st.integers(1, 5),
)
def test_matches_a_character_by_character_reference(text: str, stop: list[str], step: int) -> None:
    d = _stream(CODEC, CODEC.encode(text), tuple(stop), step)
    assert d.text == _reference(text, tuple(stop))


def test_real_tokenizer_streams_the_same_text() -> None:
    pytest.importorskip("tokenizers")
    try:
        from kvcake.proxy.textcodec import ModelCodec

        codec = ModelCodec()
    except Exception as exc:  # the weights package is optional
        pytest.skip(f"SmolLM2 tokenizer not available: {exc}")
    ids = codec.encode(TEXT)
    d = _stream(codec, ids, ())
    assert d.text == codec.decode(ids)
    long_text = TEXT * 1000  # long enough to take the GIL-free path: the same ids
    assert codec.encode(long_text) == codec._tok.encode(long_text)  # type: ignore[attr-defined]
    stopped = _stream(codec, ids, ("日本",))
    assert stopped.stopped and stopped.text == TEXT[: TEXT.index("日本")]
