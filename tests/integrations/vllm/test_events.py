"""vLLM KV events -> kvcake block names (encoded with vLLM's own event classes)."""

from __future__ import annotations

import msgspec
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch

from kvcake.conductor.index import PrefixIndex
from kvcake.core.hashing import block_hashes
from kvcake.fleet.adapter import parse_metrics
from kvcake.fleet.index import EngineEvents
from kvcake.fleet.proxy import parse_engine

ENC = msgspec.msgpack.Encoder()


def stored(hashes: list[bytes], parent: bytes | None, tokens: list[int]) -> BlockStored:
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                       block_size=4, lora_id=None, medium="GPU", lora_name=None)  # fmt: skip


def batch(*events: object) -> bytes:
    return ENC.encode(EventBatch(ts=1.0, events=list(events)))


def test_runs_are_rehashed_and_chained_on_the_parent() -> None:
    ix = PrefixIndex()
    e = EngineEvents(ix, "a", 4, 100)
    toks = list(range(16))
    e.apply(batch(stored([b"v0", b"v1"], None, toks[:8])))
    e.apply(batch(stored([b"v2", b"v3"], b"v1", toks[8:])))  # a later step, same request
    assert ix.prefix_matches(block_hashes(toks, 4)) == {"a": 4}
    e.apply(batch(BlockRemoved(block_hashes=[b"v3"], medium="GPU")))
    assert ix.prefix_matches(block_hashes(toks, 4)) == {"a": 3}
    e.apply(batch(AllBlocksCleared()))
    assert len(ix) == 0 and len(e) == 0


def test_unknown_parent_foreign_block_size_and_garbage_are_skipped() -> None:
    ix = PrefixIndex()
    e = EngineEvents(ix, "a", 4, 100)
    e.apply(batch(stored([b"x"], b"never-seen", list(range(4)))))
    odd = BlockStored(block_hashes=[b"y"], parent_block_hash=None, token_ids=[1] * 8,
                      block_size=8, lora_id=None, medium="GPU", lora_name=None)  # fmt: skip
    e.apply(batch(odd))
    e.apply(b"\xff\x00garbage")
    e.apply(ENC.encode([1.0, [{"type": "BlockStored", "block_hashes": "nope"}], None]))
    assert len(ix) == 0 and e.skipped == 1 and e.bad_batches == 2


def test_bounded_by_engine_blocks() -> None:
    ix = PrefixIndex()
    e = EngineEvents(ix, "a", 4, 1)
    e.apply(batch(stored([b"v0", b"v1"], None, list(range(8)))))
    assert len(e) == 0 and e.skipped == 2


def test_metrics_and_engine_flags() -> None:
    text = (
        '# HELP x\nvllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
        "vllm:kv_cache_usage_perc 0.25\nvllm:num_requests_running_extra 9\n"
        'vllm:generation_tokens_total{engine="0"} 17.0\n'
    )
    m = parse_metrics(text)
    assert m == {"vllm:num_requests_running": 2.0, "vllm:num_requests_waiting": 1.0,
                 "vllm:kv_cache_usage_perc": 0.25, "vllm:generation_tokens_total": 17.0}  # fmt: skip
    ref = parse_engine("a=http://127.0.0.1:1/@tcp://127.0.0.1:2")
    assert (ref.id, ref.url, ref.events) == ("a", "http://127.0.0.1:1", "tcp://127.0.0.1:2")


def test_fleet_places_a_request_where_its_prefix_is() -> None:
    from kvcake.fleet.adapter import EngineRef, FleetConfig, VllmFleet

    fleet = VllmFleet(
        [EngineRef("a", "http://127.0.0.1:1"), EngineRef("b", "http://127.0.0.1:2")],
        FleetConfig(block_tokens=4),
    )
    for e in fleet.engines.values():
        e.healthy = True
    toks = list(range(400))
    for holder in ("a", "b"):  # each engine holds a different conversation's prefix
        ev = fleet.events[holder]
        mine = [t + (0 if holder == "a" else 1000) for t in toks]
        ev.apply(batch(stored([f"{holder}{i}".encode() for i in range(100)], None, mine)))
    for holder, offset in (("a", 0), ("b", 1000)):
        turn2 = [t + offset for t in toks] + [7, 7, 7, 7, 7]
        engine, _ = fleet.dispatch(f"r-{holder}", turn2, 8)
        assert engine.id == holder
        fleet.done(f"r-{holder}", engine.id, 0.0)


def test_fleet_fits_its_prefill_predictor_to_what_the_engines_take() -> None:
    """The preset is kvcake's own CPU engine; a vLLM engine here prefills several times faster.
    First tokens of clean placements (no queue of ours on the engine, no pool fetch) refit the
    predictor the conductor prices queues and prefills with; other placements are no sample."""
    import dataclasses

    from kvcake.fleet.adapter import EngineRef, FleetConfig, VllmFleet

    fleet = VllmFleet(
        [EngineRef("a", "http://127.0.0.1:1"), EngineRef("b", "http://127.0.0.1:2")],
        FleetConfig(block_tokens=4),
    )
    for e in fleet.engines.values():
        e.healthy = True
    preset = fleet.predictors.prefill
    for i, n in enumerate((256, 512, 1024, 1536, 2048, 768) * 2):
        p = fleet.plan(f"r{i}", [5000 + i, *range(n - 1)], 4)  # fresh prompts: misses
        assert p.clean and p.cached == 0 and p.tokens == n
        fleet.observe_prefill(p, preset.time(n) / 8)  # an engine 8x faster than the preset
        fleet.done(f"r{i}", p.prefill.id, p.predicted_s)
    fitted = fleet.predictors.prefill
    assert fleet.conductor.predictors is fleet.predictors
    for n in (300, 2048, 3000):
        assert abs(fitted.time(n) / (preset.time(n) / 8) - 1) < 0.2
    busy = fleet.plan("q1", list(range(9000, 9400)), 4)  # booked, not answered yet
    again = dataclasses.replace(busy, clean=False)  # e.g. queued behind it
    samples = fleet.fit.fitted().prefill_samples
    fleet.observe_prefill(again, 100.0)
    assert fleet.fit.fitted().prefill_samples == samples  # not a prefill-speed sample
    assert fleet.plan("q2", list(range(9500, 9900)), 4).clean  # the other engine was free
