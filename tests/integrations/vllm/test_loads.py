"""The connector's loads (``integrations/vllm/loads.py``): layer groups, waits, deadline, errors.

Pure logic over a real ``PagedKV`` of small CPU tensors and a stand-in pool client that writes
each pool object's bytes (or fails, or hangs) as told; vLLM's engines are in test_connector.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from typing import Any

import pytest
import torch

from kvcake.core.ranges import RangeTable
from kvcake.integrations.vllm.config import ConnectorConfig
from kvcake.integrations.vllm.loads import Loader, failed_blocks
from kvcake.integrations.vllm.paged import PagedKV
from kvcake.integrations.vllm.plan import BlockRun
from kvcake.integrations.vllm.worker import Counters
from kvcake.store.errors import ObjectNotFound

LAYERS = [f"model.layers.{i}.attn" for i in range(6)]
NUM_BLOCKS = 8


def value(key: str, size: int) -> bytes:
    return bytes((zlib.crc32(key.encode()) + i) % 251 for i in range(size))


class FakeClient:
    """``batch_get_into_ranges`` as the store does it: each (offset, view) gets the value's bytes
    at that offset. ``hold[n]``: the n-th call waits on that event first; ``missing``: keys that
    fail with ObjectNotFound."""

    def __init__(self, size: int):
        self.size = size
        self.calls = 0
        self.hold: dict[int, threading.Event] = {}
        self.missing: set[str] = set()
        self.raises: dict[int, BaseException] = {}  # the n-th call raises this

    def batch_get_into_ranges(self, keys: list[str], ranges: list[Any], guard: Any) -> list[Any]:
        n, self.calls = self.calls, self.calls + 1
        if n in self.hold:
            self.hold[n].wait(30)
        if n in self.raises:
            raise self.raises[n]
        out: list[Any] = []
        for key, spec in zip(keys, ranges, strict=True):
            rs = spec.views() if isinstance(spec, RangeTable) else spec  # a load hands tables
            if key in self.missing:
                out.append(ObjectNotFound(key))
                continue
            data = value(key, self.size)
            with guard.commit():
                for off, view in rs:
                    view[:] = data[off : off + view.nbytes]
            out.append(sum(v.nbytes for _, v in rs))
        return out


class FakePool:
    def __init__(self, client: FakeClient):
        self._client = client
        self.failures: list[str] = []
        self.log = logging.getLogger("test.loads")

    def client(self) -> FakeClient:
        return self._client

    def failed(self, what: str, exc: BaseException) -> None:
        self.failures.append(f"{what}: {exc}")


def setup(groups: int, timeout_s: float = 5.0) -> tuple[PagedKV, FakeClient, FakePool, Loader]:
    caches = {name: torch.zeros(NUM_BLOCKS, 2, 4) for name in LAYERS}
    paged = PagedKV(caches, NUM_BLOCKS)
    client = FakeClient(paged.block_bytes)
    pool = FakePool(client)
    cfg = ConnectorConfig(master="127.0.0.1:1", load_layer_groups=groups, load_timeout_s=timeout_s)
    return paged, client, pool, Loader(pool, Counters(), cfg)  # type: ignore[arg-type]


def block_bytes(paged: PagedKV, block: int) -> bytes:
    return b"".join(bytes(v) for _, v in paged.ranges(block))


RUNS = [BlockRun("r1", ["k1", "k2"], [3, 5]), BlockRun("r2", ["k3"], [1])]


def test_a_layer_waits_only_for_its_own_group_and_every_byte_lands() -> None:
    paged, client, _, loader = setup(groups=3)
    client.hold[2] = threading.Event()  # the last group (layers 4, 5) is slow
    load = loader.start(paged, RUNS)
    assert len(load.futures) == 3 and load.group_of[LAYERS[0]] == 0
    for layer in LAYERS[:4]:
        load.wait_layer(layer)  # groups 0 and 1 are in; the forward goes on
    assert not load.futures[2].done()
    client.hold[2].set()
    load.wait_layer(LAYERS[4])
    load.wait_layer(LAYERS[5])
    assert load.finish() == set()
    for key, block in (("k1", 3), ("k2", 5), ("k3", 1)):
        assert block_bytes(paged, block) == value(key, paged.block_bytes)
    assert not any(block_bytes(paged, b).strip(b"\0") for b in (0, 2, 4, 6, 7))
    data = loader.counters.take()
    assert data["load_blocks"] == 3 and data["load_bytes"] == 3 * paged.block_bytes


def test_one_group_is_a_whole_load_the_forward_never_waits_for() -> None:
    paged, client, _, loader = setup(groups=1)
    load = loader.start(paged, RUNS)
    assert load.group_of == {} and client.calls <= 1
    assert load.finish() == set() and client.calls == 1
    assert block_bytes(paged, 5) == value("k2", paged.block_bytes)


@pytest.mark.parametrize("hung", [0, 1])  # the first group (the later ones are dropped), the last
def test_a_group_past_the_deadline_fails_every_block_and_no_late_byte_lands(hung: int) -> None:
    paged, client, pool, loader = setup(groups=2, timeout_s=0.3)
    client.hold[hung] = threading.Event()
    load = loader.start(paged, RUNS)
    t0 = time.monotonic()
    for layer in LAYERS:
        load.wait_layer(layer)
    assert 0.2 < time.monotonic() - t0 < 5
    assert load.finish() == {3, 5, 1}
    assert loader.counters.take()["load_deadline_misses"] == 1 and pool.failures
    # the store still hangs: the next load fails fast instead of queueing behind it
    t0 = time.monotonic()
    assert loader.start(paged, RUNS).finish() == {3, 5, 1}
    assert time.monotonic() - t0 < 0.2
    client.hold[hung].set()  # the hung read ends: its guard is cancelled, nothing lands
    time.sleep(0.2)
    assert client.calls == 1 + hung  # a group queued behind a hung one never runs
    late = slice(paged.block_bytes // 2 * hung, paged.block_bytes // 2 * (hung + 1))
    assert not any(block_bytes(paged, b)[late].strip(b"\0") for b in (3, 5, 1))


def test_a_missing_block_fails_itself_and_the_rest_of_its_run() -> None:
    paged, client, _, loader = setup(groups=2)
    client.missing = {"k1"}
    load = loader.start(paged, RUNS)
    for layer in LAYERS:
        load.wait_layer(layer)
    assert load.finish() == {3, 5}  # r1's first block is missing; r2 is whole
    assert failed_blocks(RUNS, [False, True, False]) == {5}


def test_a_forward_that_never_waits_gets_every_block_recomputed_and_whole_loads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    paged, _, _, loader = setup(groups=3)
    load = loader.start(paged, RUNS)
    load.wait_layer(LAYERS[0])  # an attention backend without vLLM's per-layer hook
    with caplog.at_level(logging.WARNING):
        assert load.finish() == {3, 5, 1}
    assert "did not wait" in caplog.text and loader.layer_groups == 1
    assert loader.start(paged, RUNS).group_of == {}


def test_config_refuses_zero_layer_groups() -> None:
    from kvcake.core.errors import ConfigError

    with pytest.raises(ConfigError, match="load_layer_groups"):
        ConnectorConfig.from_extra({"master": "127.0.0.1:1", "load_layer_groups": 0})


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("exc", [RuntimeError("bug"), OSError("connection reset"), ValueError()])
def test_any_exception_of_a_load_is_a_recompute_never_the_forwards(
    groups: int, exc: Exception
) -> None:
    paged, client, pool, loader = setup(groups=groups)
    client.raises[groups - 1] = exc  # the last group's read raises
    load = loader.start(paged, RUNS)
    for layer in LAYERS:
        load.wait_layer(layer)  # what vLLM's attention calls: must not raise
    assert load.finish() == {3, 5, 1}
    assert load.failed_requests({5}) == {"r1"} and pool.failures
    assert loader.counters.take()["load_error_blocks"] == 3


def test_a_load_that_cannot_start_fails_every_block() -> None:
    paged, _, pool, loader = setup(groups=2)
    bad = [BlockRun("r", ["k1"], [NUM_BLOCKS + 5])]  # a block id vLLM's tensors do not have
    load = loader.start(paged, bad)
    load.wait_layer(LAYERS[0])
    assert load.finish() == {NUM_BLOCKS + 5} and "out of range" in pool.failures[0]


def test_the_load_reads_this_ranks_objects_and_a_failing_name_is_a_recompute() -> None:
    paged, _, pool, loader = setup(groups=2)
    rank1 = lambda k: f"{k}/tp1of2"  # noqa: E731
    load = loader.start(paged, RUNS, rank1)
    for layer in LAYERS:
        load.wait_layer(layer)
    assert load.finish() == set()
    assert block_bytes(paged, 5) == value("k2/tp1of2", paged.block_bytes)

    def broken(key: str) -> str:
        raise KeyError(key)

    load = loader.start(paged, RUNS, broken)
    load.wait_layer(LAYERS[0])
    assert load.finish() == {3, 5, 1} and pool.failures
