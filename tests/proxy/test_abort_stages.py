"""Abort at every stage of a disaggregated request under concurrent load: no other request's KV
changes, and every block is accounted for afterwards.

Real parts: two prefill instances and one decode instance (emulated backend, real KV bytes) in
this process, with real Transfer Engines writing prefill KV layer by layer into the decode
instance's segment, a real store master + storage node (subprocesses) as the pool, the real
router and conductor. The decode instance's KV memory is small, so blocks freed by an aborted
request are handed to the next one at once: a prefill that kept writing after its abort would
corrupt them. Every request that finishes normally has its whole context (prompt + answer)
checked with the emulated backend's ``verify_kv`` just before its blocks are released.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from kvcake.conductor import Conductor
from kvcake.conductor.config import ConductorConfig
from kvcake.core.api import BlockSource, DecodeTarget, PrefillTask, Role, SamplingParams
from kvcake.core.hashing import block_hashes
from kvcake.core.ids import InstanceId, RequestId
from kvcake.instance.instance import Instance
from kvcake.proxy.metrics import ProxyMetrics
from kvcake.proxy.router import Outcome, Rejected, Router
from kvcake.proxy.state import LiveCluster
from kvcake.serve.wire import InstanceError
from tests.inproc import BT, Local, close_all, make_instances, watch_kv


async def _client(router: Router, rid: str, prompt: list[int], n: int, stage: str,
                  insts: dict[str, Instance], hit: dict[str, str]) -> None:  # fmt: skip
    """One request; ``stage`` says when its client goes away ("" = never)."""
    gen = router.run(
        RequestId(rid), prompt, SamplingParams(max_tokens=n), Outcome(rid, len(prompt))
    )

    async def consume() -> None:
        async for ev in gen:
            if stage == "after_first_token" and ev.tokens:
                hit[rid] = stage
                return

    task = asyncio.ensure_future(consume())
    if stage == "queued":
        await asyncio.sleep(0.02)  # its turn on the prefill instance has not come
        if not any(rid in i.prefill._active for i in insts.values()):
            hit[rid] = stage
        task.cancel()
    elif stage == "mid_layer":
        while not any(rid in i.prefill._active for i in insts.values()) and not task.done():
            await asyncio.sleep(0.002)
        await asyncio.sleep(random.uniform(0.02, 0.2))  # its layers are ~7 ms apart
        if any(rid in i.prefill._active for i in insts.values()):
            hit[rid] = stage
        task.cancel()
    try:
        await task
    except (asyncio.CancelledError, InstanceError, Rejected):
        pass
    finally:
        await gen.aclose()


async def _fetch_abort(insts: dict[str, Instance], rid: str, prompt: list[int],
                       hit: dict[str, str]) -> None:  # fmt: skip
    """What the router does for an abort during a pool fetch: prefill (which reserves on the
    decode instance) with a fetch of pool blocks (slowed down to open the window), abort the
    prefill, then the decode."""
    p, d = insts["p1"], insts["d0"]
    target = DecodeTarget(d.instance_id, "inproc://d0", len(prompt) + BT)
    hashes = tuple(block_hashes(prompt, BT))
    task = PrefillTask(
        RequestId(rid), tuple(prompt), hashes, SamplingParams(max_tokens=4),
        (BlockSource(0, len(hashes) - 1, None),), target,
    )  # fmt: skip
    fut = asyncio.ensure_future(p.submit_prefill(task))
    while "fetching" not in hit.get(rid, ""):
        await asyncio.sleep(0.001)
    stopped = await p.abort(RequestId(rid))
    await d.abort(RequestId(rid), writer_stopped=stopped)
    with pytest.raises(InstanceError):
        await fut
    hit[rid] = "fetch"


def test_abort_at_every_stage_keeps_other_kv_intact(pool: tuple[str, str]) -> None:
    insts = make_instances(*pool, (
        ("p0", Role.PREFILL, 256, 10.0), ("p1", Role.PREFILL, 256, 10.0),
        ("d0", Role.DECODE, 96, 1.0),
    ))  # fmt: skip
    bad: list[str] = []
    good: list[str] = []
    hit: dict[str, str] = {}
    watch_kv(insts["d0"], bad, good)
    p1 = insts["p1"].prefill
    real_fetch = p1._fetch

    def slow_fetch(task: Any, *a: Any) -> int:
        if str(task.request_id).startswith("fetch"):
            hit[str(task.request_id)] = "fetching"
            time.sleep(0.1)
        return real_fetch(task, *a)

    p1._fetch = slow_fetch  # type: ignore[method-assign]
    try:
        accounts = asyncio.run(_load(insts, hit))
    finally:
        close_all(insts)
    assert not bad, f"KV of {bad} changed under them"
    assert len(good) >= 6, good
    stages = set(hit.values())
    assert {"queued", "mid_layer", "after_first_token", "fetch"} <= stages, hit
    for name, acct in accounts.items():  # kv_check asserted used + cached + free == capacity
        assert acct["used"] == 0, (name, acct)  # nothing leaked, nothing left fenced
        assert acct["reservations"] == 0 and acct["fenced"] == 0, (name, acct)


async def _load(insts: dict[str, Instance], hit: dict[str, str]) -> dict[str, dict[str, int]]:
    locals_ = {InstanceId(n): Local(i) for n, i in insts.items()}
    cluster = LiveCluster(locals_, BT, 64, 1e9)  # type: ignore[arg-type]
    # No admission: the small decode memory is what the test is about (requests wait for it).
    cond = Conductor(ConductorConfig(ttft_slo_s=600.0, tbt_slo_s=60.0))
    router = Router(cluster, cond, ProxyMetrics(), ())
    router.reserve_wait_s = 60.0
    stop = asyncio.Event()
    poller = asyncio.ensure_future(cluster.run(0.02, stop))
    rng = random.Random(7)
    shared = [rng.randrange(300, 500) for _ in range(4 * BT)]
    seeded = shared + [rng.randrange(300, 500) for _ in range(40)]
    await _client(router, "seed", seeded, 2, "", insts, hit)  # puts `shared` into the pool
    stages = ["", "", "queued", "mid_layer", "after_first_token"]
    jobs = []
    for i in range(20):
        stage = stages[i % len(stages)]
        # A victim streaming mid-prompt is long (its layers come slowly, so its stale writes
        # would land after a short newcomer wrote the same blocks); the rest are short.
        n_prompt = rng.randrange(400, 600) if stage == "mid_layer" else rng.randrange(40, 160)
        prompt = (shared if i % 3 == 0 else []) + [rng.randrange(300, 500) for _ in range(n_prompt)]
        jobs.append(_client(router, f"r{i}-{stage or 'ok'}", prompt, rng.randrange(4, 40),
                            stage, insts, hit))  # fmt: skip
    jobs += [_fetch_abort(insts, f"fetch{k}", seeded, hit) for k in range(2)]
    await asyncio.gather(*jobs)
    for _ in range(1500):  # detached cleanups, background puts (slow on a loaded machine)
        busy = router.in_cleanup or any(
            i.decoder.busy() or i.prefill.busy() or (i.writer and i.writer.pinned)
            for i in insts.values()
        )
        if not busy:
            break
        await asyncio.sleep(0.02)
    stop.set()
    await poller
    return {name: inst.kv_check() for name, inst in insts.items()}
