from __future__ import annotations

import time

import pytest

from kvcake.core.api import SamplingParams
from kvcake.core.costmodel import preset
from kvcake.core.errors import ConfigError, EngineError
from kvcake.core.ids import RequestId
from kvcake.engine.backend import DecodeSeq
from kvcake.engine.config import EmulatedConfig
from kvcake.engine.emulated import EmulatedBackend
from kvcake.engine.scheduler import Request, Scheduler


def test_default_kv_size_is_scaled_llama3_70b() -> None:
    be = EmulatedBackend(EmulatedConfig(num_kv_blocks=8))
    full = preset().model.kv_bytes_per_token
    assert full == 327_680
    assert be.layout.kv_bytes_per_token == 320  # 80 layers x K,V x 2 bytes ~ 327,680 / 1000
    assert be.num_layers == 80
    be.close()


def test_prefill_sleeps_cost_model_time_and_streams_layers() -> None:
    cfg = EmulatedConfig(time_scale=0.5, layers=8, num_kv_blocks=64)
    be = EmulatedBackend(cfg)
    toks = list(range(1000, 1000 + 1500))
    table = be.allocate_blocks(be.blocks_needed(len(toks)))
    seen: list[tuple[int, float]] = []
    t0 = time.perf_counter()
    first = be.prefill(
        toks, table, 500, SamplingParams(), lambda i: seen.append((i, time.perf_counter()))
    )
    took = time.perf_counter() - t0
    want = be.cost_model.prefill_time(1500, 500) * 0.5
    assert want * 0.95 <= took <= want * 1.5 + 0.5  # upper bound generous: CI machines are busy
    assert [i for i, _ in seen] == list(range(8))
    assert seen[0][1] - t0 >= want / 8 * 0.9  # layer 0 completes after 1/8 of the time
    assert first >= 100
    assert be.verify_kv(toks, table, start=500)
    assert not be.verify_kv(toks, table, start=0)  # the "cached" part was never written
    be.free_blocks(table)
    be.close()


def test_kv_bytes_survive_transfer_to_another_instance() -> None:
    a = EmulatedBackend(EmulatedConfig(time_scale=0, num_kv_blocks=16))
    b = EmulatedBackend(EmulatedConfig(time_scale=0, num_kv_blocks=16))
    toks = list(range(70))
    ta = a.allocate_blocks(3)
    tb = b.allocate_blocks(4)[1:]
    first = a.prefill(toks, ta, 0, SamplingParams())
    b.import_blocks(tb, a.export_blocks(ta))
    assert b.verify_kv(toks, tb)
    seq = DecodeSeq(RequestId("r"), tb, len(toks), first)
    out = [b.decode([seq])[0] for _ in range(5)]
    assert seq.num_computed == 75 and all(t >= 100 for t in out)
    assert b.verify_kv([*toks, first, *out[:-1]], tb)


def test_decode_time_follows_cost_model() -> None:
    be = EmulatedBackend(EmulatedConfig(time_scale=2.0, num_kv_blocks=64))
    seqs = [DecodeSeq(RequestId(f"s{i}"), be.allocate_blocks(8), 200, 5) for i in range(4)]
    t0 = time.perf_counter()
    be.decode(seqs)
    took = time.perf_counter() - t0
    want = be.cost_model.decode_step_time(4, 4 * 201) * 2.0
    assert want * 0.95 <= took <= want * 1.5 + 0.5  # upper bound generous: CI machines are busy


def test_scheduler_runs_on_emulated_backend_with_prefix_reuse() -> None:
    be = EmulatedBackend(EmulatedConfig(time_scale=0, num_kv_blocks=32))
    s = Scheduler(be, max_batch=4)
    prompt = list(range(200, 300))
    reqs = [Request(RequestId(f"r{i}"), prompt, SamplingParams(max_tokens=5)) for i in range(3)]
    for r in reqs:
        s.add(r)
    while s.has_work:
        s.step()
    assert [len(r.output) for r in reqs] == [5, 5, 5]
    assert reqs[0].cached_tokens == 0 and reqs[1].cached_tokens == 96
    be.blocks.check()
    assert be.blocks.num_used == 0


def test_bad_config_and_tables() -> None:
    with pytest.raises(ConfigError):
        EmulatedConfig(preset="nope")
    with pytest.raises(ConfigError):
        EmulatedConfig(kv_scale=0)
    be = EmulatedBackend(EmulatedConfig(time_scale=0, num_kv_blocks=4))
    with pytest.raises(EngineError):
        be.prefill(list(range(100)), [0], 0, SamplingParams())  # table too short
    with pytest.raises(EngineError):
        be.prefill(list(range(10)), [9], 0, SamplingParams())  # block id out of range
