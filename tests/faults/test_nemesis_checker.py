"""The nemesis's checker on hand-made histories (pure logic) and its value format: it must flag
a wrong read, a torn value, a stale read and a lost write, and accept a legal superseded read."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.nemesis.checker import (
    Fault,
    Op,
    load_history,
    lost_objects,
    outages,
    vanished_reads,
    wrong_reads,
)
from benchmarks.nemesis.values import decode, encode
from benchmarks.nemesis.worker import History

INF = math.inf


def w(f: str, key: str, ver: str, t0: float, t1: float = INF, outcome: str = "ok",
      place: list[str] | None = None) -> Op:  # fmt: skip
    return Op("w", f, (key,), t0, t1, outcome, version=ver, place=place)


def rd(key: str, got: list[object] | None, t0: float, t1: float) -> Op:
    return Op("r", "get", (key,), t0, t1, "ok", reads=[got])


def kinds(ops: list[Op]) -> list[str]:
    return [p.kind for p in wrong_reads(ops)]


def test_values_name_their_key_and_version_and_catch_tearing() -> None:
    v = encode("k1", "w0.1.7", 8192)
    assert len(v) == 8192
    assert decode(v).as_list() == ["k1", "w0.1.7", True]
    flipped = bytearray(v)
    flipped[5000] ^= 1
    assert decode(flipped).intact is False
    assert decode(v[:-1]).intact is False  # truncated
    assert decode(b"garbage").intact is False
    mixed = v[:4000] + encode("k1", "w0.1.8", 8192)[4000:]  # two versions' halves
    assert decode(mixed).intact is False


def test_reads_of_acknowledged_writes_pass() -> None:
    ops = [w("put", "k", "v1", 0, 1), rd("k", ["k", "v1", True], 2, 3), rd("k", None, 0.5, 0.6)]
    assert kinds(ops) == []


def test_another_keys_bytes_and_torn_bytes_are_flagged() -> None:
    ops = [w("put", "k1", "v1", 0, 1), w("put", "k2", "v2", 0, 1),
           rd("k1", ["k2", "v2", True], 2, 3), rd("k1", ["k1", "v1", False], 2, 3)]  # fmt: skip
    assert kinds(ops) == ["other-key", "torn"]


def test_versions_never_written_or_refused_or_from_the_future_are_flagged() -> None:
    ops = [w("put", "k", "v1", 0, 1), w("upsert", "k", "v2", 2, 3, "fail"),
           w("upsert", "k", "v3", 10, 11), rd("k", ["k", "v9", True], 4, 5),
           rd("k", ["k", "v2", True], 4, 5), rd("k", ["k", "v3", True], 4, 5)]  # fmt: skip
    assert kinds(ops) == ["unknown-version", "unknown-version", "future"]


def test_a_version_superseded_before_the_read_began_is_stale() -> None:
    ops = [w("put", "k", "v1", 0, 1), w("upsert", "k", "v2", 2, 3),
           rd("k", ["k", "v1", True], 4, 5)]  # fmt: skip
    assert kinds(ops) == ["stale"]
    gone = [w("put", "k", "v1", 0, 1), w("remove", "k", "", 2, 3),
            rd("k", ["k", "v1", True], 4, 5)]  # fmt: skip
    assert kinds(gone) == ["stale"]


def test_a_superseded_version_is_legal_when_the_upsert_was_acked_after_the_read_was_sent() -> None:
    ops = [w("put", "k", "v1", 0, 1), w("upsert", "k", "v2", 3, 4),
           rd("k", ["k", "v1", True], 2, 5), rd("k", ["k", "v2", True], 2, 5),
           rd("k", ["k", "v1", True], 3.5, 3.9)]  # fmt: skip
    assert kinds(ops) == []


def test_unknown_writes_may_show_at_any_time_after_their_invoke() -> None:
    ops = [w("put", "k", "v1", 0, 1), w("upsert", "k", "v2", 2, outcome="info"),
           rd("k", ["k", "v2", True], 50, 51), rd("k", ["k", "v1", True], 50, 51)]  # fmt: skip
    assert kinds(ops) == []


def test_an_unknown_call_that_ended_in_an_error_took_effect_before_that_or_never() -> None:
    ops = [w("put", "k", "v1", 0, 1), w("upsert", "k", "v2", 2, 3, "info"),
           w("upsert", "k", "v3", 4, 5), rd("k", ["k", "v2", True], 6, 7)]  # fmt: skip
    assert kinds(ops) == ["stale"]  # v2 ended (error) at 3, v3 was acked after: v2 is gone
    problems, _ = lost_objects(ops[:3], {"k": ["k", "v2", True]}, [], ["s0"])
    assert [p.kind for p in problems] == ["lost"]


def test_a_remove_answered_not_found_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / "hist-c0.jsonl"
    with path.open("w") as fh:
        h = History(fh, "c0.1")
        h.done(h.invoke("put", ["k"], "v1"), "ok")
        h.done(h.invoke("remove", ["k"]), "fail", err="ObjectNotFound: 'k' not found")
        h.done(h.invoke("upsert", ["k"], "v2"), "fail", err="ObjectHasLease: 'k' is being read")
    ops = load_history([path])
    assert [o.outcome for o in ops] == ["ok", "info", "fail"]
    assert lost_objects(ops, {"k": None}, [], ["s0"]) == ([], 0)  # the remove may have run


def test_final_state_lost_write_and_lost_update_are_flagged() -> None:
    ops = [w("put", "a", "a1", 0, 1), w("put", "b", "b1", 0, 1), w("upsert", "b", "b2", 2, 3),
           w("put", "c", "c1", 0, 1), w("remove", "c", "", 2, 3),
           w("put", "d", "d1", 0, 1), w("remove", "d", "", 2, outcome="info")]  # fmt: skip
    final = {"a": None, "b": ["b", "b1", True], "c": None, "d": None}
    problems, excused = lost_objects(ops, final, [], ["s0", "s1"])
    assert [(p.kind, p.key) for p in problems] == [("lost", "a"), ("lost", "b")]
    assert excused == 0
    ok, _ = lost_objects(ops, {"a": ["a", "a1", True], "b": ["b", "b2", True], "c": None,
                               "d": ["d", "d1", True]}, [], ["s0"])  # fmt: skip
    assert ok == []
    torn, _ = lost_objects(ops[:1], {"a": ["a", "a1", False]}, [], ["s0"])
    assert [p.kind for p in torn] == ["wrong-final"]


def test_a_loss_is_excused_only_when_every_replica_node_died_after_the_write() -> None:
    died = [Fault("kill-store", "s0", 5, 6, node_dead="s0")]
    one = [w("put", "k", "v1", 0, 1, place=["s0"])]
    assert lost_objects(one, {"k": None}, died, ["s0", "s1"]) == ([], 1)
    two = [w("put", "k", "v1", 0, 1, place=["s0", "s1"])]
    problems, excused = lost_objects(two, {"k": None}, died, ["s0", "s1"])
    assert [p.kind for p in problems] == ["lost"] and excused == 0
    later = [w("put", "k", "v1", 7, 8, place=["s0"])]  # written after s0 came back
    assert [p.kind for p in lost_objects(later, {"k": None}, died, ["s0"])[0]] == ["lost"]
    unknown = [w("put", "k", "v1", 0, 1, place=None)]  # placement unknown: any death excuses
    assert lost_objects(unknown, {"k": None}, died, ["s0", "s1"]) == ([], 1)


def test_a_read_that_finds_nothing_where_an_acked_object_must_be_is_flagged() -> None:
    base = [w("put", "k", "v1", 0, 1, place=["s0"])]
    assert [p.kind for p in vanished_reads([*base, rd("k", None, 2, 3)], [], ["s0"])] == [
        "vanished"
    ]
    legal = [
        rd("k", None, 0.5, 0.9),  # before the put was acknowledged
        w("upsert", "k", "v2", 2.5, 4), rd("k", None, 3, 3.5),  # an upsert hides it meanwhile
        w("remove", "k", "", 5, outcome="info"), rd("k", None, 6, 7),  # may have removed it
    ]  # fmt: skip
    assert vanished_reads([*base, *legal], [], ["s0"]) == []
    died = [Fault("kill-store", "s0", 1.5, 1.8, node_dead="s0")]
    assert vanished_reads([*base, rd("k", None, 2, 3)], died, ["s0"]) == []


def test_outage_is_injection_to_first_answer_after_it() -> None:
    ops = [Op("w", "get", ("k",), 9.0, 9.5, "ok"), Op("w", "get", ("k",), 10.2, 30, "info"),
           Op("w", "put", ("k",), 10.5, 13.0, "fail"), Op("w", "get", ("k",), 11, 12.5, "ok")]  # fmt: skip
    faults = [Fault("pause-leader", "m0", 10.0, 12.0), Fault("kill-leader", "m1", 20.0, 21.0)]
    got = outages(ops, faults, end=40)
    assert got[0].first is not None and abs(got[0].first - 2.5) < 1e-9
    assert abs(got[0].gap - 7.0) < 1e-9  # 13.0 -> 20.0 (the next fault) without an answer
    assert got[1].first is None and abs(got[1].gap - 20.0) < 1e-9


def test_history_files_round_trip_and_an_unfinished_call_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / "hist-c0.jsonl"
    with path.open("w") as fh:
        h = History(fh, "c0.1")
        i = h.invoke("put", ["c0-k1"], "c0.1.1")
        h.done(i, "ok", place=["s0"])
        i = h.invoke("get", ["c0-k1"])
        h.done(i, "ok", read=[["c0-k1", "c0.1.1", True]])
        h.invoke("upsert", ["c0-k1"], "c0.1.2")  # then SIGKILL: no completion line
        fh.write('{"type": "ok", "i": 9')  # a line cut short
    ops = load_history([path])
    assert [(o.f, o.outcome) for o in ops] == [("put", "ok"), ("get", "ok"), ("upsert", "info")]
    assert ops[0].place == ["s0"] and ops[2].complete == INF
    assert wrong_reads(ops) == []
