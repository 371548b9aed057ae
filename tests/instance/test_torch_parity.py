"""Disaggregated serving of the real SmolLM2 model is token-identical to one ``LLM.generate``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from kvcake.core.api import SamplingParams
from kvcake.launch.launcher import Cluster
from tests.cluster import make_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def torch_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = make_cluster(
        tmp_path_factory.mktemp("torch"),
        cluster={"prefill": 1, "decode": 1, "store_servers": 1, "store_size": "128MB"},
        instance={"backend": "torch", "kv_blocks": 160},
    )
    with c:
        yield c


def test_greedy_output_matches_llm_generate(torch_cluster: Cluster) -> None:
    from kvcake.engine.llm import LLM

    rng = np.random.default_rng(7)
    long_prompt = [int(t) for t in rng.integers(300, 40000, size=600)]
    chat = [{"role": "user", "content": "Name three colours of the rainbow."}]
    llm = LLM("smollm2", num_kv_blocks=160, threads=1)
    try:
        sp = SamplingParams(max_tokens=8, temperature=0.0)
        want_long, want_chat = llm.generate([long_prompt, chat], sp)
    finally:
        llm.backend.close()
    url = torch_cluster.url
    for _ in range(2):  # the second time the prompt's KV is reused from the prefill's cache
        r = httpx.post(url + "/v1/completions", timeout=300,
                       json={"prompt": long_prompt, "max_tokens": 8, "temperature": 0})  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["kvcake"]["token_ids"] == list(want_long.token_ids)
    assert (
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 600 - 600 % 32
    )  # 18 full blocks
    r = httpx.post(url + "/v1/chat/completions", timeout=300,
                   json={"messages": chat, "max_tokens": 8, "temperature": 0})  # fmt: skip
    doc = r.json()
    assert doc["kvcake"]["token_ids"] == list(want_chat.token_ids)
    assert doc["choices"][0]["message"]["content"] == want_chat.text
    assert r.headers["x-kvcake-prefill"] != r.headers["x-kvcake-decode"]  # disaggregated
