"""Token selection (greedy, or temperature + top-p sampling) and the one stop rule.

With ``seed`` set, the token for position ``p`` is drawn from a generator seeded with
``(seed, p)``: a request gives the same tokens whether it is prefilled and decoded on one
instance or on two, and whatever else shares its batch.

:func:`finish_reason` is the only place that decides when a request stops: the offline
scheduler (``engine.scheduler``), the serving decode loop and the proxy's first-token check all
call it. torch is imported lazily so the emulated serving path never loads it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from kvcake.core.api import FinishReason, SamplingParams

if TYPE_CHECKING:
    import torch


def finish_reason(
    token: int,
    generated: int,
    sampling: SamplingParams,
    eos_token_ids: Collection[int],
    context_len: int = 0,
    max_context: int = 0,
) -> FinishReason | None:
    """Why a request ends after emitting ``token`` (``None``: it goes on).

    ``generated`` counts output tokens including ``token``; ``context_len`` is prompt + output
    including ``token``. STOP when ``token`` is one of ``sampling.stop_token_ids`` (always, as in
    vLLM) or an EOS id (unless ``ignore_eos``); LENGTH at ``max_tokens`` or when the context
    reaches ``max_context`` (0 = no limit)."""
    if token in sampling.stop_token_ids or (not sampling.ignore_eos and token in eos_token_ids):
        return FinishReason.STOP
    if generated >= sampling.max_tokens or (max_context and context_len >= max_context):
        return FinishReason.LENGTH
    return None


def _generator(seed: int | None, position: int) -> torch.Generator | None:
    # lazy: optional dependency (torch)
    import torch

    if seed is None:
        return None
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + position) % (2**63))
    return g


def _sample_row(logits: torch.Tensor, sp: SamplingParams, position: int) -> int:
    # lazy: optional dependency (torch)
    import torch

    probs = torch.softmax(logits.float() / sp.temperature, dim=-1)
    if sp.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        keep = (cum - sorted_p) < sp.top_p  # always keeps the most likely token
        sorted_p = sorted_p * keep
        choice = torch.multinomial(sorted_p, 1, generator=_generator(sp.seed, position))
        return int(idx[choice])
    return int(torch.multinomial(probs, 1, generator=_generator(sp.seed, position)))


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], positions: Sequence[int]
) -> list[int]:
    """One token per row of ``logits [B, vocab]``; ``positions[i]`` is where it will sit."""
    greedy = logits.argmax(dim=-1).tolist()
    out: list[int] = []
    for i, sp in enumerate(params):
        out.append(
            int(greedy[i]) if sp.temperature == 0 else _sample_row(logits[i], sp, positions[i])
        )
    return out
