"""The proxy's poller marks an instance down on a bad answer and back on the next good one,
and never ends on an error: it is what brings a restarted instance back into routing."""

from __future__ import annotations

import asyncio
import time

import msgspec

from kvcake.core.api import LoadReport, Role
from kvcake.core.ids import InstanceId
from kvcake.proxy.state import LiveCluster
from kvcake.serve.wire import InstanceState


class Scripted:
    """An instance whose state answers are scripted: a state, or an exception to raise."""

    def __init__(self, answers: list[object]) -> None:
        self.instance_id = InstanceId("d0")
        self.role = Role.DECODE
        self.alive = True
        self.answers = answers

    async def fetch_state(self, since: int) -> InstanceState:
        got = self.answers.pop(0) if self.answers else self.good()
        if isinstance(got, Exception):
            raise got
        assert isinstance(got, InstanceState)
        return got

    def good(self) -> InstanceState:
        return InstanceState(LoadReport(self.instance_id, self.role, time.time()), (), 0, 0)


def test_a_malformed_answer_marks_the_instance_down_and_the_next_good_one_back() -> None:
    inst = Scripted([msgspec.DecodeError("truncated body"), ValueError("bad field")])
    cluster = LiveCluster({inst.instance_id: inst}, 16, 64, 1e9)  # type: ignore[dict-item]

    async def run() -> list[bool]:
        seen = []
        for _ in range(3):
            await cluster.poll_once()  # never raises
            seen.append(inst.alive)
        return seen

    assert asyncio.run(run()) == [False, False, True]


def test_the_poll_loop_survives_an_error_of_its_own() -> None:
    inst = Scripted([])
    cluster = LiveCluster({inst.instance_id: inst}, 16, 64, 1e9)  # type: ignore[dict-item]
    calls = []
    real = cluster.poll_once

    async def once() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in one round")
        await real()

    cluster.poll_once = once  # type: ignore[method-assign]

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(cluster.run(0.01, stop))
        deadline = time.monotonic() + 5
        while len(calls) < 3 and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        stop.set()
        await task  # re-raises if the loop ended on the error

    asyncio.run(run())
    assert len(calls) >= 3 and inst.alive
