"""Token selection: greedy, or temperature + top-p sampling.

With ``seed`` set, the token for position ``p`` is drawn from a generator seeded with
``(seed, p)``: a request gives the same tokens whether it is prefilled and decoded on one
instance or on two, and whatever else shares its batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvcake.core.api import SamplingParams


def _generator(seed: int | None, position: int) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + position) % (2**63))
    return g


def _sample_row(logits: torch.Tensor, sp: SamplingParams, position: int) -> int:
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
