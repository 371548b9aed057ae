"""Our paged forward against transformers' LlamaForCausalLM on the same fp32 weights (both read
the checkpoint converted from the GGUF): greedy tokens identical, logits within tight tolerance."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvcake.core.api import SamplingParams
from kvcake.core.ids import RequestId
from kvcake.engine.backend import DecodeSeq

from .conftest import PROMPTS

LOGIT_ATOL = 2e-3  # fp32 rounding differences only; logits are O(10)
GREEDY = SamplingParams(max_tokens=1)


def ours(be: Any, ids: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    table = be.allocate_blocks(be.blocks_needed(len(ids) + steps))
    try:
        logits = [be.prefill_logits(ids, table, 0)[0]]
        seq = DecodeSeq(RequestId("p"), table, len(ids), int(logits[0].argmax()))
        toks = [seq.last_token]
        for _ in range(steps - 1):
            logits.append(be.decode_logits([seq])[0])
            seq.last_token = int(logits[-1].argmax())
            toks.append(seq.last_token)
        return toks, logits
    finally:
        be.free_blocks(table)


@torch.inference_mode()
def reference(hf: Any, ids: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    out = hf(torch.tensor([ids]), use_cache=True)
    logits, past = [out.logits[0, -1]], out.past_key_values
    toks = [int(logits[0].argmax())]
    for _ in range(steps - 1):
        out = hf(torch.tensor([[toks[-1]]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits.append(out.logits[0, -1])
        toks.append(int(logits[-1].argmax()))
    return toks, logits


def _check(fresh: Any, hf_model: Any, ids: list[int], steps: int) -> None:
    got, got_logits = ours(fresh, ids, steps)
    want, want_logits = reference(hf_model, ids, steps)
    assert got == want
    for a, b in zip(got_logits, want_logits, strict=True):
        assert torch.allclose(a, b, atol=LOGIT_ATOL, rtol=0), float((a - b).abs().max())


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_matches_transformers(fresh: Any, hf_model: Any, prompt: str) -> None:
    _check(fresh, hf_model, fresh.tokenizer.encode(prompt), steps=8)


def test_chat_prompt_matches_transformers(fresh: Any, hf_model: Any) -> None:
    ids = fresh.tokenizer.encode_chat([{"role": "user", "content": "Name a large animal."}])
    _check(fresh, hf_model, ids, steps=8)


@pytest.mark.slow
def test_long_prompt_matches_transformers(
    fresh: Any, hf_model: Any, long_prompt: list[int]
) -> None:
    assert len(long_prompt) >= 1500
    _check(fresh, hf_model, long_prompt, steps=4)


def test_batched_decode_matches_transformers(fresh: Any, hf_model: Any) -> None:
    """A decode batch (> 1 row) goes through the packed oneDNN copies of gate/up and the LM
    head: each sequence of the batch still matches transformers run alone."""
    if fresh.model.packed:
        assert fresh.model.lm_head_p is not None and fresh.model.layers[0].gate_up_p is not None
    prompts = [fresh.tokenizer.encode(p) for p in PROMPTS]
    steps = 8
    tables = [fresh.allocate_blocks(fresh.blocks_needed(len(ids) + steps)) for ids in prompts]
    try:
        seqs, got_logits = [], []
        for i, (ids, table) in enumerate(zip(prompts, tables, strict=True)):
            first = fresh.prefill_logits(ids, table, 0)[0]
            seqs.append(DecodeSeq(RequestId(f"b{i}"), table, len(ids), int(first.argmax())))
            got_logits.append([first])
        for _ in range(steps - 1):
            logits = fresh.decode_logits(seqs)
            for i, s in enumerate(seqs):
                got_logits[i].append(logits[i])
                s.last_token = int(logits[i].argmax())
    finally:
        for table in tables:
            fresh.free_blocks(table)
    for ids, got in zip(prompts, got_logits, strict=True):
        want_toks, want = reference(hf_model, ids, steps)
        assert [int(g.argmax()) for g in got] == want_toks
        for a, b in zip(got, want, strict=True):
            assert torch.allclose(a, b, atol=LOGIT_ATOL, rtol=0), float((a - b).abs().max())


def test_packed_and_mapped_weights_agree(fresh: Any) -> None:
    """The same decode batch through the packed copies and through the mapped weights only
    (``packed=False``): logits equal to fp32 rounding, same greedy tokens."""
    from kvcake.engine.model.llama import PagedLlama
    from kvcake.engine.model.weights import map_weights

    plain = PagedLlama(
        fresh.model_config, map_weights(fresh.checkpoint), fresh.model.kv, packed=False
    )
    prompts = [fresh.tokenizer.encode(p) for p in PROMPTS]
    tables = [fresh.allocate_blocks(fresh.blocks_needed(len(ids) + 1)) for ids in prompts]
    try:
        last = [fresh.prefill(ids, t, 0, GREEDY) for ids, t in zip(prompts, tables, strict=True)]
        nb = max(len(t) for t in tables)
        args = (
            torch.tensor(last),
            torch.tensor([len(ids) for ids in prompts]),
            torch.tensor([t + [t[0]] * (nb - len(t)) for t in tables]),
        )
        a, b = fresh.model.decode(*args), plain.decode(*args)
    finally:
        for t in tables:
            fresh.free_blocks(t)
    assert torch.allclose(a, b, atol=1e-3, rtol=0), float((a - b).abs().max())
    assert a.argmax(-1).tolist() == b.argmax(-1).tolist()


def test_answers_capital_of_france(fresh: Any) -> None:
    ids = fresh.tokenizer.encode_chat(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    toks, _ = ours(fresh, ids, steps=8)
    assert "Paris" in fresh.tokenizer.decode(toks)
