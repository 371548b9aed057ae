"""Malformed and oversized bodies, raw over httpx: always a JSON 4xx, never a 500, and the
proxy keeps serving."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from kvcake.launch.launcher import Cluster
from tests.openai_proxy import BODY_LIMIT, extra_proxy


@pytest.fixture(scope="module")
def url(emulated_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with extra_proxy(emulated_cluster, tmp_path_factory.mktemp("bodies")) as u:
        yield u


def _post(url: str, path: str, content: bytes | Iterator[bytes], **headers: str) -> httpx.Response:
    return httpx.post(url + path, content=content, timeout=30,
                      headers={"content-type": "application/json", **headers})  # fmt: skip


@pytest.mark.parametrize(
    "body",
    [
        b'{"prompt": "\xff\xfe", "max_tokens": 1}',  # not UTF-8
        b'{"prompt": "caf\xc3", "max_tokens": 1}',  # a truncated UTF-8 sequence
        b'{"prompt": "\\ud800", "max_tokens": 1}',  # a lone surrogate escape
        b'{"prompt": "a\\udfff b", "max_tokens": 1}',
        b'{"prompt": "hi", "stop": "\\ud83d"}',
        b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # nesting
        b'{"prompt": "hi", "x": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}",
        b'{"prompt": "hi", "temperature": NaN}',
        b'{"prompt": "hi", "temperature": 1e999}',
        b'{"prompt": "hi", "max_tokens": 1.5}',
        b'{"prompt": "hi", "max_tokens": true}',
        b'{"prompt": ["a", "b"], "max_tokens": 1}',  # a batch of prompts
        b'{"prompt": "hi", "stop": 5}',
        b'{"prompt": "hi", "stop": ["a", 5]}',
        b'{"prompt": "hi", "stop_token_ids": "x"}',
        b'{"prompt": "hi", "ignore_eos": "yes"}',
        b'{"prompt": "hi", "stream_options": {"include_usage": "y"}}',
        b'{"prompt": "hi", "stream_options": {"bogus": true}}',
        b'{"prompt": "hi", "model": 5}',
        b'{"prompt": "hi", "user": 5}',
        b'{"prompt": "hi", "max_completion_tokens": 3}',  # a chat-only field
        b"",
        b"\x00\x01\x02",
    ],
)
def test_bad_completion_bodies_are_json_400(url: str, body: bytes) -> None:
    r = _post(url, "/v1/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": [{"role": "user", "content": "\\udc80"}]}',
        b'{"messages": [{"role": "tool", "content": "x"}]}',
        b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}',
        b'{"messages": [{"role": "user", "content": null}]}',
        b'{"messages": [{"role": "user", "content": "x", "tool_calls": []}]}',
        b'{"messages": [{"role": "user", "content": "x"}], "echo": true}',
        b'{"messages": [{"role": "user", "content": "x"}], "logprobs": 1}',
    ],
)
def test_bad_chat_bodies_are_json_400(url: str, body: bytes) -> None:
    r = _post(url, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    assert "error" in r.json()


def test_content_parts_and_developer_role(url: str) -> None:
    body = {"messages": [{"role": "developer", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "hé"}],
                          "name": "ann"}], "max_tokens": 2}  # fmt: skip
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text


def test_body_over_the_limit_is_413_from_content_length(url: str) -> None:
    big = b'{"prompt": "' + b"a" * (BODY_LIMIT + 10) + b'"}'
    r = _post(url, "/v1/completions", big)
    assert r.status_code == 413, r.text
    assert "max_body_bytes" in r.json()["error"]["message"]


def test_body_over_the_limit_is_413_while_reading(url: str) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        yield b'{"prompt": "'
        for _ in range(BODY_LIMIT // 65536 + 2):
            yield b"a" * 65536
        yield b'"}'

    r = _post(url, "/v1/completions", chunks())
    assert r.status_code == 413, r.text
    assert httpx.get(url + "/health", timeout=10).status_code == 200


def test_a_body_just_under_the_limit_is_served(url: str) -> None:
    """The limit is on bytes, not on what they mean: this one is parsed (and refused for its
    length in tokens, with a 400 naming the context)."""
    body = b'{"prompt": "' + b"a" * (BODY_LIMIT - 100) + b'", "max_tokens": 1}'
    r = _post(url, "/v1/completions", body)
    assert r.status_code == 400 and "context" in r.json()["error"]["message"], r.text
    assert "at least" in r.json()["error"]["message"]  # refused before tokenizing
