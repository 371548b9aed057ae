"""Bad input to the engine API raises EngineError (a KvcakeError) and leaves the engine usable."""

from __future__ import annotations

from typing import Any

import pytest

from kvcake.core.api import FinishReason, SamplingParams
from kvcake.core.errors import EngineError, KvcakeError
from kvcake.core.ids import RequestId
from kvcake.engine.backend import DecodeSeq

from .helpers import run

SP = SamplingParams()


@pytest.mark.parametrize(
    ("tokens", "table", "cached"),
    [
        ([], [0], 0),  # empty prompt
        ([5, 6], [0], 3),  # more cached than prompt
        ([5] * 40, [0], 0),  # table too short
        ([5, 6], [10_000], 0),  # block id out of range
        ([5, -1], [0], 0),  # negative token id
        ([5, 49152], [0], 0),  # token id past the vocabulary
    ],
)
def test_bad_prefill_inputs(fresh: Any, tokens: list[int], table: list[int], cached: int) -> None:
    with pytest.raises(EngineError):
        fresh.prefill(tokens, table, cached, SP)


def test_prompt_longer_than_context(fresh: Any) -> None:
    n = fresh.model_config.max_positions + 1
    with pytest.raises(EngineError, match="context"):
        fresh.prefill([5] * n, list(range(fresh.blocks_needed(n))), 0, SP)


def test_bad_decode_inputs(fresh: Any) -> None:
    with pytest.raises(EngineError):
        fresh.decode_logits([])
    with pytest.raises(EngineError):
        fresh.decode([DecodeSeq(RequestId("x"), [0], 32, 5)])  # no slot for position 32
    with pytest.raises(EngineError):
        fresh.decode([DecodeSeq(RequestId("x"), [0], 3, 10**6)])  # bad token id


def test_scheduler_reports_errors_per_request(fresh: Any) -> None:
    ok = fresh.tokenizer.encode("Hello")
    bad, good = run(fresh, [[5, 10**7], ok], SamplingParams(max_tokens=2))
    assert bad.finish_reason is FinishReason.ERROR and bad.error
    assert good.finish_reason is FinishReason.LENGTH and len(good.output) == 2


def test_request_larger_than_kv_memory_fails_cleanly(fresh: Any) -> None:
    n = (fresh.layout.num_blocks + 1) * fresh.block_tokens
    (r,) = run(fresh, [[5] * n])
    assert r.finish_reason is FinishReason.ERROR and "KV blocks" in (r.error or "")


def test_engine_errors_are_kvcake_errors() -> None:
    assert issubclass(EngineError, KvcakeError)
