"""Decode memory grows with the answer: the reservation covers the prompt plus one block, the
decode loop grows tables as tokens come, and when the decode KV runs out requests are preempted
and recomputed — every request finishes with its full answer and intact KV, none errors."""

from __future__ import annotations

import asyncio
import random
import time

from kvcake.conductor import Conductor
from kvcake.conductor.config import ConductorConfig
from kvcake.core.api import FinishReason, Role, SamplingParams
from kvcake.core.ids import InstanceId, RequestId
from kvcake.proxy.metrics import ProxyMetrics
from kvcake.proxy.router import Outcome, Router
from kvcake.proxy.state import LiveCluster
from tests.inproc import BT, Local, close_all, make_instances, watch_kv


def test_answers_longer_than_decode_memory_preempt_and_finish(pool: tuple[str, str]) -> None:
    # Decode memory: 24 blocks = 384 tokens; 4 requests of 40 + 160 tokens need 800.
    insts = make_instances(*pool, (("p0", Role.PREFILL, 128, 1.0), ("d0", Role.DECODE, 24, 1.0)))
    bad: list[str] = []
    good: list[str] = []
    watch_kv(insts["d0"], bad, good)
    reserved: list[int] = []
    d0 = insts["d0"]
    real_reserve = d0.reserve_kv

    async def spy(rid: RequestId, n: int, *prompt: object) -> object:
        reserved.append(n)
        return await real_reserve(rid, n, *prompt)  # type: ignore[arg-type]

    d0.reserve_kv = spy  # type: ignore[method-assign]
    try:
        results = asyncio.run(_run(insts))
        for _ in range(300):  # the answers' background pool puts
            if not (d0.writer and d0.writer.pinned):
                break
            time.sleep(0.01)
        acct = d0.kv_check()
    finally:
        close_all(insts)
    assert reserved and all(n == 40 + BT for n in reserved), reserved  # prompt + one block
    for reasons, n_tokens in results:
        assert reasons == [FinishReason.LENGTH] and n_tokens == 160, (reasons, n_tokens)
    assert not bad and len(good) == 4, (bad, good)
    assert acct["preemptions"] >= 1, acct  # memory really ran out
    assert acct["used"] == 0 and acct["reservations"] == 0, acct


async def _run(insts: dict) -> list[tuple[list[FinishReason], int]]:  # type: ignore[type-arg]
    cluster = LiveCluster({InstanceId(n): Local(i) for n, i in insts.items()}, BT, 64, 1e9)  # type: ignore[arg-type]
    router = Router(cluster, Conductor(ConductorConfig(ttft_slo_s=600, tbt_slo_s=60)),
                    ProxyMetrics(), ())  # fmt: skip
    await cluster.poll_once()
    rng = random.Random(3)

    async def one(i: int) -> tuple[list[FinishReason], int]:
        prompt = [rng.randrange(300, 500) for _ in range(40)]
        rid = RequestId(f"g{i}")
        sp = SamplingParams(max_tokens=160, ignore_eos=True)
        reasons, n = [], 0
        async for ev in router.run(rid, prompt, sp, Outcome(rid, 40)):
            n += len(ev.tokens)
            if ev.finish is not None:
                reasons.append(ev.finish)
        return reasons, n

    out = await asyncio.gather(*(one(i) for i in range(4)))
    for _ in range(200):
        if not router.in_cleanup:
            break
        await asyncio.sleep(0.01)
    return list(out)
