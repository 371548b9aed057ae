"""The Conductor entry point: malformed input, configuration, colocated mode, caches."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from kvcake.conductor import Conductor, ConductorConfig, PrefixIndex
from kvcake.core.api import Accept, ClusterSnapshot, KVIndex, Reject, RequestView
from kvcake.core.config import load_config
from kvcake.core.errors import ConfigError, SchedulingError
from kvcake.core.ids import RequestId

from .util import BT, PRED, blocks, decode, index_with, pstate, request, snapshot

STATES = [pstate("p0", 0.2), pstate("p1", 0.5), pstate("p2", 5.0)]
HOLD = {"p0": 0, "p1": 4, "p2": 8}


def _c(**cfg) -> Conductor:  # type: ignore[no-untyped-def]
    return Conductor(ConductorConfig(**cfg), PRED)


def _snap(**changes) -> ClusterSnapshot:  # type: ignore[no-untyped-def]
    return dataclasses.replace(snapshot(STATES, index_with(HOLD)), **changes)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"prefill": (pstate("p0", 0.0), pstate("p0", 1.0))}, "twice"),
        ({"prefill": (pstate("p0", -1.0),)}, "queued_seconds"),
        ({"prefill": (pstate("p0", math.nan),)}, "queued_seconds"),
        ({"prefill": (pstate("p0", math.inf),)}, "queued_seconds"),
        ({"prefill": (pstate("p0", 0.0, bw=-5.0),)}, "fetch_bandwidth"),
        ({"prefill": (pstate("p0", 0.0, bw=math.nan),)}, "fetch_bandwidth"),
        ({"prefill": (pstate("p0", 0.0), pstate("p1", None))}, "numbers"),  # type: ignore[arg-type]
        ({"block_tokens": 0}, "block_tokens"),
        ({"kv_bytes_per_token": -1}, "kv_bytes_per_token"),
        ({"link_bandwidth": 0.0}, "link_bandwidth"),
        ({"link_bandwidth": math.nan}, "link_bandwidth"),
        ({"kv_index": {"not": "an index"}}, "KVIndex"),
        ({"decode": (decode("d0"), decode("d0"))}, "twice"),
        ({"decode": (decode("d0", cap=0),)}, "kv_capacity"),
    ],
)
def test_malformed_snapshot_raises_scheduling_error(changes, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SchedulingError, match=match):
        _c().schedule(request(), _snap(**changes))


def test_malformed_request_raises_scheduling_error() -> None:
    c = _c()
    too_many = RequestView(RequestId("r"), 0.0, 95, blocks(11), 10)  # 95 tokens: 10 blocks max
    with pytest.raises(SchedulingError, match="block hashes"):
        c.schedule(too_many, _snap())
    with pytest.raises(SchedulingError, match="prompt_len"):
        c.schedule(RequestView(RequestId("r"), 0.0, 0, (), 10), _snap())
    with pytest.raises(SchedulingError, match="expected_output"):
        c.schedule(RequestView(RequestId("r"), 0.0, 10, (), -1), _snap())
    with pytest.raises(SchedulingError, match="non-numeric"):
        c.schedule(RequestView(RequestId("r"), 0.0, None, (), 1), _snap())  # type: ignore[arg-type]
    with pytest.raises(SchedulingError, match="non-numeric"):
        c.schedule(request(), _snap(block_tokens="512"))
    # A trailing partial block is allowed (trace hash_ids name it).
    ok = RequestView(RequestId("r"), 0.0, 95, blocks(10), 10)
    assert isinstance(c.schedule(ok, _snap()), Accept)


def test_scheduling_error_is_a_kvcake_error_and_conductor_survives() -> None:
    from kvcake.core.errors import KvcakeError

    c = _c()
    with pytest.raises(KvcakeError):
        c.schedule(request(), _snap(block_tokens=0))
    assert isinstance(c.schedule(request(), _snap()), Accept)  # still usable afterwards


def test_estimate_ttfts_for_all_instances() -> None:
    c = _c()
    snap = _snap(prefill=(*STATES, pstate("p3", 0.0, healthy=False)))
    est = c.estimate_ttfts(request(), snap)
    assert est[:3] == pytest.approx([1.48, 1.74, 6.2])
    assert est[3] == math.inf


def test_prefix_index_and_core_index_decide_identically() -> None:
    rng = np.random.default_rng(5)
    for trial in range(40):
        n = int(rng.integers(1, 9))
        hold = {f"p{i}": int(rng.integers(0, 11)) for i in range(n)}
        if rng.random() < 0.3:
            hold["store"] = int(rng.integers(0, 11))
        states = [pstate(f"p{i}", float(rng.uniform(0, 3)), healthy=bool(rng.random() > 0.2)) for i in range(n)]  # fmt: skip
        thr = float(rng.uniform(1.0, 3.0))
        got = []
        for cls in (PrefixIndex, KVIndex):
            c = _c(kvcache_balancing_threshold=thr)
            got.append(c.schedule(request(), snapshot(states, index_with(hold, cls))))
        assert got[0] == got[1], trial


def test_reused_and_changed_snapshot_tuples() -> None:
    c = _c()
    idx = index_with(HOLD)
    snap = snapshot(STATES, idx)
    d1 = c.schedule(request(), snap)
    assert c.schedule(request(), snap) == d1  # cached arrays reused
    # A new tuple with different queues is re-read, not served from the cache.
    busy = [pstate("p0", 9.0), STATES[1], STATES[2]]
    d2 = c.schedule(request(), snapshot(busy, idx))
    assert isinstance(d2, Accept) and d2.prefill == "p1"
    # A holder that appears later gets a bit; the cached bit table is refreshed.
    idx.add("p2x", blocks(10))  # type: ignore[arg-type]
    states = [*STATES, pstate("p2x", 0.0)]
    d3 = c.schedule(request(), snapshot(states, idx))
    assert isinstance(d3, Accept) and d3.prefill == "p2x" and d3.fetch == ()
    assert d3.expected_ttft_s == pytest.approx(0.0)  # fully cached, empty queue
    # Membership change: a removed instance is no longer chosen.
    d4 = c.schedule(request(), snapshot(STATES[1:], idx))
    assert isinstance(d4, Accept) and d4.prefill in ("p1", "p2")


def test_colocated_uses_the_prefill_instance_for_decode() -> None:
    c = _c(colocated=True, prefill_policy="least-load")
    decs = (decode("p0", running=30, ctx=30_000), decode("p1"), decode("p2"))
    d = c.schedule(request(), _snap(decode=decs))
    assert isinstance(d, Accept) and (d.prefill, d.decode) == ("p0", "p0")
    assert d.expected_tbt_s == pytest.approx(0.01 + 0.031 + 0.0301)
    with pytest.raises(SchedulingError, match="colocated"):
        c.schedule(request(), _snap(decode=(decode("p1"),)))


def test_config_validation_and_loading(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for bad in (
        {"prefill_policy": "fastest"},
        {"admission_policy": "maybe"},
        {"ttft_slo_s": 0.0},
        {"tbt_slo_s": -1.0},
        {"tbt_slo_s": math.inf},
        {"kvcache_balancing_threshold": 0.9},
        {"kvcache_balancing_threshold": math.nan},
        {"uniform_decode_s": -1.0},
    ):
        with pytest.raises(ConfigError):
            ConductorConfig(**bad)
    path = tmp_path / "c.toml"
    path.write_text(
        '[conductor]\nprefill_policy = "round-robin"\nadmission_policy = "prediction"\n'
        "tbt_slo_s = 0.1\nkvcache_balancing_threshold = 2\n"
    )
    cfg = load_config(ConductorConfig, toml_path=path, section="conductor")
    assert (cfg.prefill_policy, cfg.admission_policy, cfg.tbt_slo_s) == (
        "round-robin", "prediction", 0.1,
    )  # fmt: skip
    assert cfg.kvcache_balancing_threshold == 2.0
    path.write_text('[conductor]\nprefil_policy = "random"\n')
    with pytest.raises(ConfigError, match="prefil_policy"):
        load_config(ConductorConfig, toml_path=path, section="conductor")


def test_default_conductor_uses_the_reference_cost_model() -> None:
    c = Conductor()
    big = RequestView(RequestId("r"), 0.0, 8192, (), 100)
    snap = dataclasses.replace(snapshot([pstate("p0", 0.0)], index_with({})), block_tokens=512)
    d = c.schedule(big, snap)
    assert isinstance(d, Accept)
    assert d.expected_ttft_s == pytest.approx(c.predictors.prefill.time(8192, 0))
    assert not isinstance(d, Reject)
    assert BT == 10


def test_snapshot_order_independent_of_index_order() -> None:
    idx = index_with(HOLD)  # bits assigned p0, p1, p2
    c = _c()
    for states in (STATES, STATES[::-1], [STATES[2], STATES[0], STATES[1]]):
        view = c._views.build(request(), snapshot(states, idx))
        assert dict(zip(view.ids, view.local.tolist(), strict=True)) == HOLD
        d = c.schedule(request(), snapshot(states, idx))
        assert isinstance(d, Accept) and d.prefill == "p0"
        assert d.expected_ttft_s == pytest.approx(1.48)


def test_hot_prefix_gets_replicated_by_a_driver_loop() -> None:
    """A tiny driver (what the simulator does): each accepted request adds its transfer +
    prefill time to the chosen instance's queue, and fetched blocks are added to that instance.
    The hot 10-block prefix (prompt 105 tokens: prefill with it cached = 1 + 0.05 = 1.05 s;
    fetching it = 100 tokens * 0.001 = 0.1 s) spreads over every instance:

    r0: p0 1.05 | others 1.15 (fetch)           -> p0, queue p0 = 1.05
    r1: p0 2.10 | p1..p3 1.15                   -> p1 fetches from p0
    r2: p0 2.10 | p1 2.20 | p2, p3 1.15         -> p2 fetches from p0 (tie p0/p1: first)
    r3: p0 2.10 | p1, p2 2.20 | p3 1.15         -> p3 fetches from p0
    r4: p0 2.10 | p1..p3 2.20                   -> p0, no fetch
    """
    hot = blocks(10)
    idx = PrefixIndex()
    idx.add("p0", hot)  # type: ignore[arg-type]
    queues = {f"p{i}": 0.0 for i in range(4)}
    c = _c()
    got = []
    for k in range(5):
        req = RequestView(RequestId(f"r{k}"), float(k), 105, hot, 10)
        snap = snapshot([pstate(n, q) for n, q in queues.items()], idx)
        d = c.schedule(req, snap)
        assert isinstance(d, Accept)
        got.append((d.prefill, tuple(s.holder for s in d.fetch), round(d.expected_ttft_s, 9)))
        queues[d.prefill] += d.expected_ttft_s - queues[d.prefill]
        for src in d.fetch:
            idx.add(d.prefill, hot[src.first_block : src.first_block + src.num_blocks])
    assert got == [
        ("p0", (), 1.05),
        ("p1", ("p0",), 1.15),
        ("p2", ("p0",), 1.15),
        ("p3", ("p0",), 1.15),
        ("p0", (), 2.1),
    ]
    assert idx.holders(hot[0]) == frozenset({"p0", "p1", "p2", "p3"})
