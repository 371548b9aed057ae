"""Prefix caching, chunked prefill, continuous batching, sampling and stop conditions all give
the tokens a plain single run gives."""

from __future__ import annotations

from typing import Any

import pytest

from kvcake.core.api import FinishReason, SamplingParams
from kvcake.core.ids import RequestId
from kvcake.engine.scheduler import Request, Scheduler

from .helpers import GREEDY6, run

TEXT = (
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of having "
    "nothing to do: once or twice she had peeped into the book her sister was reading, but it "
    "had no pictures or conversations in it, and what is the use of a book, thought Alice, "
    "without pictures or conversations? So she was considering in her own mind (as well as she "
    "could, for the hot day made her feel very sleepy and stupid)"
)


@pytest.fixture(scope="module")
def prompt(backend: Any) -> list[int]:
    ids: list[int] = backend.tokenizer.encode(TEXT)
    assert len(ids) > 2 * backend.block_tokens
    return ids


@pytest.fixture(scope="module")
def plain(backend: Any, prompt: list[int]) -> list[int]:
    (r,) = run(backend, [prompt], prefix_caching=False)
    assert r.cached_tokens == 0
    return r.output


def test_prefix_cached_run_matches_plain(fresh: Any, prompt: list[int], plain: list[int]) -> None:
    first = run(fresh, [prompt])[0]
    again = run(fresh, [prompt])[0]
    assert again.cached_tokens == (len(prompt) // fresh.block_tokens) * fresh.block_tokens
    assert first.output == again.output == plain
    # A prompt sharing only the first blocks reuses exactly those.
    other = prompt[: 2 * fresh.block_tokens] + fresh.tokenizer.encode(" and then the rabbit")
    r = run(fresh, [other])[0]
    assert r.cached_tokens == 2 * fresh.block_tokens
    assert r.output == run(fresh, [other], prefix_caching=False)[0].output


def test_fully_cached_prompt_reads_shared_blocks_without_rewriting(
    fresh: Any, prompt: list[int]
) -> None:
    ids = prompt[: 2 * fresh.block_tokens]  # exactly two full blocks
    want = run(fresh, [ids], prefix_caching=False)[0].output
    run(fresh, [ids])
    blocks = fresh.lookup_prefix(fresh.block_hashes(ids))
    before = fresh.export_blocks(blocks)
    r = run(fresh, [ids])[0]
    assert r.cached_tokens == len(ids)
    assert r.output == want
    assert fresh.export_blocks(blocks) == before
    fresh.free_blocks(blocks)


def test_chunked_prefill_matches_plain(fresh: Any, prompt: list[int], plain: list[int]) -> None:
    (r,) = run(fresh, [prompt], prefill_chunk=13, prefix_caching=False)
    assert r.output == plain


def test_layer_callback_runs_once_per_layer_in_order(fresh: Any, prompt: list[int]) -> None:
    from kvcake.engine.config import EngineConfig

    assert isinstance(fresh.cfg, EngineConfig)
    seen: list[int] = []
    table = fresh.allocate_blocks(fresh.blocks_needed(len(prompt)))
    try:
        fresh.prefill(prompt, table, 0, GREEDY6, on_layer_done=seen.append)
    finally:
        fresh.free_blocks(table)
    assert seen == list(range(fresh.num_layers))


def test_batched_requests_join_and_leave(fresh: Any, prompt: list[int], plain: list[int]) -> None:
    short = fresh.tokenizer.encode("The quick brown fox")
    other = fresh.tokenizer.encode("Water boils at a temperature of")
    solo_short = run(fresh, [short], prefix_caching=False)[0].output
    solo_other = run(fresh, [other], SamplingParams(max_tokens=3, ignore_eos=True))[0].output
    s = Scheduler(fresh, max_batch=4, prefill_chunk=40, prefix_caching=False)
    a = Request(RequestId("a"), prompt, GREEDY6)
    b = Request(RequestId("b"), short, GREEDY6)
    c = Request(RequestId("c"), other, SamplingParams(max_tokens=3, ignore_eos=True))
    s.add(a)
    s.add(b)
    batch_sizes = []
    while s.has_work:
        s.step()
        batch_sizes.append(len(s.running))
        if len(batch_sizes) == 4:
            s.add(c)  # joins while a and b decode
    assert max(batch_sizes) >= 2
    assert (a.output, b.output, c.output) == (plain, solo_short, solo_other)
    assert c.finish_reason is FinishReason.LENGTH


def test_seeded_sampling_is_reproducible(fresh: Any, prompt: list[int], plain: list[int]) -> None:
    sp = SamplingParams(max_tokens=6, temperature=1.0, top_p=0.95, seed=7, ignore_eos=True)
    one = run(fresh, [prompt], sp)[0].output
    assert run(fresh, [prompt], sp)[0].output == one
    # Batched with another request, the same seed gives the same tokens.
    two = run(fresh, [prompt, prompt[:40]], sp)[0].output
    assert two == one
    others = {
        tuple(
            run(
                fresh,
                [prompt],
                SamplingParams(max_tokens=6, temperature=1.5, seed=s, ignore_eos=True),
            )[0].output
        )
        for s in range(3)
    }
    assert len(others) > 1
    tiny_p = SamplingParams(max_tokens=6, temperature=1.0, top_p=1e-6, seed=3, ignore_eos=True)
    assert run(fresh, [prompt], tiny_p)[0].output == plain


def test_stop_token_and_max_tokens(fresh: Any, prompt: list[int], plain: list[int]) -> None:
    stop = SamplingParams(max_tokens=6, stop_token_ids=(plain[2],), ignore_eos=True)
    r = run(fresh, [prompt], stop)[0]
    assert r.finish_reason is FinishReason.STOP
    assert r.output == plain[: plain.index(plain[2]) + 1]
    r = run(fresh, [prompt], SamplingParams(max_tokens=1))[0]
    assert r.finish_reason is FinishReason.LENGTH and r.output == plain[:1]
