"""The OpenAI surface through the official ``openai`` SDK, against a live (emulated) cluster:
every parameter is honoured exactly or refused with a clear 400/404."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from kvcake.launch.launcher import Cluster
from tests.openai_proxy import CONTEXT, MODELS, extra_proxy

PROMPT = list(range(300, 340))  # token ids: 40 tokens
MSGS = [{"role": "user", "content": "tell me a story"}]


@pytest.fixture(scope="module")
def client(
    emulated_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[openai.OpenAI]:
    with extra_proxy(emulated_cluster, tmp_path_factory.mktemp("oai")) as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        yield c
        c.close()


def _reference(client: openai.OpenAI, n: int = 12) -> str:
    r = client.chat.completions.create(model=MODELS[0], messages=MSGS, max_tokens=n,
                                       temperature=0)  # type: ignore[arg-type]  # fmt: skip
    assert r.choices[0].finish_reason == "length"
    text = r.choices[0].message.content
    assert text
    return text


def _pieces(text: str) -> list[str]:
    """The emulated backend's tokens render as "<id>" (ids beyond the byte range)."""
    return [p + ">" for p in text.split(">") if p]


def test_stop_string_non_streaming(client: openai.OpenAI) -> None:
    ref = _reference(client)
    toks = _pieces(ref)
    stop = toks[4]
    r = client.chat.completions.create(model=MODELS[0], messages=MSGS, max_tokens=12,
                                       temperature=0, stop=stop)  # type: ignore[arg-type]  # fmt: skip
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == "".join(toks[:4])
    assert r.usage is not None and r.usage.completion_tokens == 5  # the stop token counts
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"


def test_stop_string_streaming_holds_back_prefixes(client: openai.OpenAI) -> None:
    ref = _reference(client)
    toks = _pieces(ref)
    # A stop string spanning two tokens: the first token's text must be held back until the
    # second shows whether the stop string completes.
    stop = toks[6] + toks[7][:2]
    decoy = toks[2] + "<x"  # starts like token 3 but never completes
    stream = client.chat.completions.create(model=MODELS[0], messages=MSGS, max_tokens=12,
                                            temperature=0, stop=[decoy, stop], stream=True,
                                            stream_options={"include_usage": True})  # type: ignore[arg-type]  # fmt: skip
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert len({c.created for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(toks[:6])
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and finishes.count("stop") == 1
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


def test_completions_stop_and_ids(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODELS[0], prompt=PROMPT, max_tokens=10, temperature=0)
    toks = _pieces(r.choices[0].text)
    assert r.id.startswith("cmpl-") and r.choices[0].finish_reason == "length"
    s = client.completions.create(model=MODELS[0], prompt=PROMPT, max_tokens=10, temperature=0,
                                  stop=[toks[5], toks[3]])  # fmt: skip
    assert s.choices[0].text == "".join(toks[:3]) and s.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model=MODELS[0], prompt=PROMPT, max_tokens=10,
                                            temperature=0, stop=toks[3], stream=True))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks) == "".join(toks[:3])
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert len({(c.id, c.created) for c in chunks}) == 1


def test_max_tokens_absent_fills_the_context(client: openai.OpenAI) -> None:
    prompt = list(range(300, 300 + CONTEXT - 7))
    r = client.completions.create(model=MODELS[0], prompt=prompt, temperature=0)
    assert r.usage is not None and r.usage.completion_tokens == 7
    assert r.choices[0].finish_reason == "length"


def test_max_completion_tokens(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODELS[0], messages=MSGS, max_completion_tokens=3)  # type: ignore[arg-type]
    assert r.usage is not None and r.usage.completion_tokens == 3
    for bad in (0, -1):
        with pytest.raises(openai.BadRequestError, match="max_completion_tokens"):
            client.chat.completions.create(model=MODELS[0], messages=MSGS,  # type: ignore[arg-type]
                                           max_completion_tokens=bad)  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model=MODELS[0], prompt=PROMPT, max_tokens=CONTEXT)


def test_models_and_aliases(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == list(MODELS)
    assert client.models.retrieve("alias-b").id == "alias-b"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    r = client.completions.create(model="alias-b", prompt=PROMPT, max_tokens=1)
    assert r.model == "alias-b"
    with pytest.raises(openai.NotFoundError, match="does not exist") as exc:
        client.completions.create(model="gpt-4o", prompt=PROMPT, max_tokens=1)
    assert exc.value.status_code == 404


@pytest.mark.parametrize(
    "kw",
    [
        {"logprobs": True},
        {"logprobs": True, "top_logprobs": 2},
        {"top_logprobs": 3},
        {"presence_penalty": 0.5},
        {"frequency_penalty": -1.0},
        {"temperature": 2.5},
        {"n": 2},
        {"logit_bias": {"300": 5}},
        {"response_format": {"type": "json_object"}},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        {"stop": ["a", "b", "c", "d", "e"]},
        {"stop": ""},
    ],
)
def test_unimplemented_chat_parameters_are_400(client: openai.OpenAI, kw: dict) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODELS[0], messages=MSGS, max_tokens=2, **kw)  # type: ignore[arg-type]
    assert exc.value.status_code == 400
    key = next(iter(kw))
    assert key in str(exc.value) or key == "n", str(exc.value)


@pytest.mark.parametrize(
    "kw", [{"echo": True}, {"logprobs": 1}, {"logprobs": 0}, {"best_of": 3}, {"suffix": "end"},
           {"presence_penalty": 1}, {"temperature": 2.01}],
)  # fmt: skip
def test_unimplemented_completion_parameters_are_400(client: openai.OpenAI, kw: dict) -> None:
    with pytest.raises(openai.BadRequestError, match=next(iter(kw))):
        client.completions.create(model=MODELS[0], prompt=PROMPT, max_tokens=2, **kw)


def test_neutral_values_are_accepted(client: openai.OpenAI) -> None:
    """Values that change nothing are not errors (clients often send them explicitly)."""
    r = client.chat.completions.create(
        model=MODELS[0],
        messages=MSGS,
        max_tokens=2,
        temperature=2,
        logprobs=False,  # type: ignore[arg-type]
        presence_penalty=0,
        frequency_penalty=0,
        n=1,
        user="u-1",
        top_p=1,
        response_format={"type": "text"},
    )
    assert r.choices[0].finish_reason == "length" and r.choices[0].logprobs is None
    c = client.completions.create(model=MODELS[0], prompt=PROMPT, max_tokens=2, echo=False,
                                  best_of=1, presence_penalty=0.0)  # fmt: skip
    assert c.usage is not None and c.usage.completion_tokens == 2


def test_default_model_when_omitted(client: openai.OpenAI, tmp_path: Path) -> None:
    import httpx

    r = httpx.post(str(client.base_url) + "completions", timeout=30,
                   json={"prompt": PROMPT, "max_tokens": 1})  # fmt: skip
    assert r.status_code == 200 and r.json()["model"] == MODELS[0]
