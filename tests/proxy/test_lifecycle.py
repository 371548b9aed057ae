"""One terminal hook per request: a property test over every way a request can end.

The router runs against scripted stand-ins for the instances (the router's lifecycle is pure
logic over the ``InstanceAPI``; the real instances are exercised in test_abort_stages.py) and a
real conductor with prediction admission, which tracks every accepted request. Whatever mix of
exits runs concurrently, afterwards the admission state, the proxy's pending counts and gauges
are empty, every accepted attempt got exactly one terminal hook, and every aborted prefill was
told before its decode instance.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcake.conductor import Conductor
from kvcake.conductor.config import ConductorConfig
from kvcake.core.api import (
    FinishReason,
    LoadReport,
    PrefillResult,
    PrefillTask,
    Role,
    SamplingParams,
    TokenChunk,
)
from kvcake.core.ids import InstanceId, RequestId
from kvcake.proxy.metrics import ProxyMetrics
from kvcake.proxy.router import NotReady, Outcome, Rejected, Router
from kvcake.proxy.state import LiveCluster
from kvcake.serve.wire import InstanceError, InstanceInfo, InstanceUnavailable

EOS = 2
KINDS = (
    "normal", "eos_first", "reject_admission", "reserve_full", "prefill_error",
    "prefill_unavailable", "cancel_in_prefill", "decode_error", "decode_error_chunk",
    "client_close", "cancel_in_decode", "max_tokens_1",
)  # fmt: skip


class Scripted:
    """An instance whose answers follow the kind encoded in the request's first token."""

    def __init__(self, iid: str, role: Role, log: list[tuple[str, str, str]]):
        self.instance_id = InstanceId(iid)
        self.role = role
        self.alive = True
        self.state = None
        self.info = InstanceInfo(self.instance_id, role, "m", 16, 64, 4096, 8192, 512, (EOS,))
        self.log = log

    def load_report(self) -> LoadReport:
        return LoadReport(self.instance_id, self.role, 0.0, kv_blocks_total=4096)

    url = "scripted://"

    async def submit_prefill(self, task: PrefillTask) -> PrefillResult:
        kind = KINDS[task.prompt_tokens[0]]
        await asyncio.sleep(0)
        if task.decode is not None and kind == "reserve_full":  # gave up waiting for its KV
            raise InstanceError("full", 503, "kv_full")
        if kind == "prefill_error":
            raise InstanceError("boom", 500)
        if kind == "prefill_unavailable":
            raise InstanceUnavailable("gone")  # no instance named: it stays routable
        if kind == "cancel_in_prefill":
            await asyncio.sleep(3600)
        first = EOS if kind == "eos_first" else 300
        n = len(task.prompt_tokens)
        return PrefillResult(task.request_id, first, n, 0, n)

    async def stream_tokens(self, rid: RequestId, first: int) -> AsyncIterator[TokenChunk]:
        kind = KINDS[_kind_of[rid.split(".")[0]]]
        if kind == "max_tokens_1":
            yield TokenChunk(rid, (), FinishReason.LENGTH)
            return
        for i in range(3):
            await asyncio.sleep(0)
            if kind == "decode_error" and i == 1:
                raise InstanceError("decode died", 500)
            if kind == "cancel_in_decode" and i == 1:
                await asyncio.sleep(3600)
            yield TokenChunk(rid, (301 + i,))
        if kind == "decode_error_chunk":
            yield TokenChunk(rid, (), FinishReason.ERROR, "failed")
            return
        yield TokenChunk(rid, (), FinishReason.LENGTH)

    async def abort(self, rid: RequestId, writer_stopped: bool = False) -> bool:
        self.log.append((str(self.instance_id), str(rid), str(writer_stopped)))
        return True


_kind_of: dict[str, int] = {}


class Hooks:
    """Counts the conductor's terminal hooks per request id."""

    def __init__(self, c: Conductor):
        self.c = c
        self.ends: dict[str, int] = {}
        self.accepts: dict[str, int] = {}
        done, abort, accept = c.on_decode_done, c.on_abort, c.on_accept

        def on_accept(req: Any, dec: Any, now: float) -> None:
            rid = str(req.request_id)
            self.accepts[rid] = self.accepts.get(rid, 0) + 1
            accept(req, dec, now)

        def on_done(rid: RequestId, now: float) -> None:
            self.ends[str(rid)] = self.ends.get(str(rid), 0) + 1
            done(rid, now)

        def on_abort(rid: RequestId) -> None:
            self.ends[str(rid)] = self.ends.get(str(rid), 0) + 1
            abort(rid)

        c.on_accept, c.on_decode_done, c.on_abort = on_accept, on_done, on_abort  # type: ignore[method-assign]


async def _one(router: Router, i: int, kind: int) -> str:
    rid = RequestId(f"r{i}")
    _kind_of[rid] = kind
    name = KINDS[kind]
    prompt = [kind] + [400] * (60_000 if name == "reject_admission" else 20)
    sp = SamplingParams(max_tokens=1 if name == "max_tokens_1" else 8)
    gen = router.run(rid, prompt, sp, Outcome(rid, len(prompt)))

    async def consume() -> None:
        async for ev in gen:
            if name == "client_close" and ev.tokens:
                break  # the client went away after the first token

    task = asyncio.ensure_future(consume())
    try:
        if name.startswith("cancel"):
            await asyncio.sleep(0.01)
            task.cancel()
        await task
    except (Rejected, NotReady, InstanceError, asyncio.CancelledError):
        pass
    finally:
        await gen.aclose()
    return name


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, len(KINDS) - 1), min_size=1, max_size=12))
def test_every_exit_leaves_admission_empty(kinds: list[int]) -> None:
    async def main() -> None:
        log: list[tuple[str, str, str]] = []
        p, d = Scripted("p0", Role.PREFILL, log), Scripted("d0", Role.DECODE, log)
        cluster = LiveCluster({p.instance_id: p, d.instance_id: d}, 16, 64, 1e9)  # type: ignore[dict-item]
        cfg = ConductorConfig(admission_policy="prediction", ttft_slo_s=5.0, tbt_slo_s=10.0)
        cond = Conductor(cfg)
        hooks = Hooks(cond)
        m = ProxyMetrics()
        router = Router(cluster, cond, m, (EOS,))
        router.reserve_wait_s = 0.0
        await asyncio.gather(*(_one(router, i, k) for i, k in enumerate(kinds)))
        for _ in range(100):  # detached cleanups
            if not router.in_cleanup:
                break
            await asyncio.sleep(0.01)
        assert router.in_cleanup == 0
        assert cond.admission.in_flight == 0  # type: ignore[attr-defined]
        assert hooks.ends == hooks.accepts  # one terminal hook per accepted placement
        for pend in cluster.pending.values():
            assert (pend.requests, pend.tokens, pend.prefill_requests) == (0, 0, 0)
            assert pend.prefill_s == 0.0
        assert m.waiting._value.get() == 0 and m.running._value.get() == 0
        # Aborted before the prefill answered: prefill first, then decode, told it stopped.
        for rid in hooks.accepts:
            for aid in (rid, f"{rid}.1"):
                seen = [(who, ws) for who, r, ws in log if r == aid]
                if seen and seen[0][0] == "p0":
                    assert seen[1:] == [("d0", "True")], (aid, seen)

    asyncio.run(main())
