"""The direct P/D path's parts without vLLM: params, release notes over real zmq, the
scheduler bookkeeping, and worker pulls between real Transfer Engines over paged tensors."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kvcake.core.auth import Authenticator
from kvcake.integrations.vllm.config import ConnectorConfig
from kvcake.integrations.vllm.paged import PagedKV
from kvcake.integrations.vllm.pd import PdScheduler, PdStep, PullJob
from kvcake.integrations.vllm.pd_wire import (
    Inbox,
    Notifier,
    PdParamsError,
    decode_release,
    encode_release,
    parse_remote,
    producer_params,
)
from kvcake.integrations.vllm.pd_worker import PdWorker
from kvcake.integrations.vllm.worker import Counters, log_for
from kvcake.transfer import DirectoryService, TransferEngine
from tests.waits import wait_until

BS = 4
LOG = log_for("test")


def good() -> dict[str, Any]:
    return producer_params("eng-a", "req-1", [3, 5, 7], 16, "tcp://127.0.0.1:5999")


def test_params_round_trip() -> None:
    r = parse_remote(good())
    assert (r.engine_id, r.request_id, r.block_ids, r.num_blocks) == ("eng-a", "req-1",
                                                                      (3, 5, 7), 16)  # fmt: skip
    grouped = {**good(), "remote_block_ids": [[3, 5, 7]]}  # vLLM's per-group form
    assert parse_remote(grouped).block_ids == (3, 5, 7)


@pytest.mark.parametrize(
    "change",
    [
        {"remote_block_ids": "x"},
        {"remote_block_ids": [1, 99]},  # beyond the prefill's block count
        {"remote_block_ids": [1, True]},
        {"remote_block_ids": [[1], [2]]},  # two KV cache groups
        {"kvcake_num_blocks": 0},
        {"kvcake_num_blocks": True},
        {"remote_engine_id": ""},
        {"remote_request_id": 5},
        {"kvcake_notify": "tcp://10.0.0.1:5"},  # never anything but loopback
        {"kvcake_notify": None},
    ],
)
def test_malformed_params_are_typed_errors(change: dict[str, Any]) -> None:
    with pytest.raises(PdParamsError):
        parse_remote({**good(), **change})


def test_release_notes_over_zmq_and_malformed_ones() -> None:
    inbox = Inbox(LOG)
    notifier = Notifier(max_peers=1)
    try:
        assert inbox.address.startswith("tcp://127.0.0.1:")
        import zmq

        raw = zmq.Context.instance().socket(zmq.PUSH)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(inbox.address)
        raw.send(b"\xff\x00garbage")
        assert notifier.send(inbox.address, ["r1", "r2"])
        assert notifier.send("tcp://127.0.0.1:1", ["x"])  # evicts the first peer (max_peers=1)
        assert notifier.send(inbox.address, ["r3"])
        got: set[str] = set()
        deadline = time.monotonic() + 5
        while got != {"r1", "r2", "r3"} and time.monotonic() < deadline:
            got |= inbox.drain()
            time.sleep(0.01)
        assert got == {"r1", "r2", "r3"}
        raw.close(0)
    finally:
        inbox.close()
        notifier.close()
    with pytest.raises(PdParamsError):
        decode_release(b"\x93\x01\x02")


def test_release_notes_need_the_clusters_secret_when_it_has_one() -> None:
    good, bad = Authenticator(b"s" * 32), Authenticator(b"t" * 32)
    inbox = Inbox(LOG, auth=good)
    senders = [Notifier(auth=None), Notifier(auth=bad), Notifier(auth=good)]
    try:
        senders[0].send(inbox.address, ["unsigned"])
        senders[1].send(inbox.address, ["wrong-secret"])
        senders[2].send(inbox.address, ["signed"])
        got: set[str] = set()
        deadline = time.monotonic() + 5
        while "signed" not in got and time.monotonic() < deadline:
            got |= inbox.drain()
            time.sleep(0.01)
        time.sleep(0.1)  # the refused notes, if any were let through, would be here by now
        got |= inbox.drain()
        assert got == {"signed"}
    finally:
        inbox.close()
        for n in senders:
            n.close()
    assert decode_release(encode_release(["r"], good), good) == ["r"]
    with pytest.raises(PdParamsError, match="MAC"):
        decode_release(encode_release(["r"]), good)
    assert decode_release(encode_release(["r"], good)) == ["r"]  # no secret here: accepted


def req(rid: str, prompt: int, params: dict[str, Any] | None) -> Any:
    return SimpleNamespace(request_id=rid, prompt_token_ids=list(range(prompt)),
                           kv_transfer_params=params)  # fmt: skip


def test_scheduler_bookkeeping_prefill_and_decode() -> None:
    p = PdScheduler("eng-p", 16, BS, lease_s=0.3, log=LOG)
    d = PdScheduler("eng-d", 16, BS, lease_s=0.3, log=LOG, produce=False)
    try:
        # prefill: 11 prompt tokens -> 2 full blocks kept, a lease taken
        hold, params = p.produced(req("p1", 11, {"do_remote_decode": True}), [9, 4, 6])
        assert hold and params["remote_block_ids"] == [9, 4]
        # decode: 1 block cached locally; 1 to load (the last token's block is computed)
        r = req("d1", 11, dict(params))
        assert d.match(r, local_tokens=4) == (4, True)
        assert d.allocated(r, [0, 1, 2], 4)
        assert r.kv_transfer_params["do_remote_prefill"] is False  # one pull per request
        step = d.step()
        assert [(j.remote_block_ids, j.local_block_ids) for j in step.pulls] == [([4], [1])]
        assert d.finished(r) is True  # its blocks stay held until the worker's read ended
        assert d.match(req("x", 11, {"do_remote_prefill": True}), 0) is None  # pool params
        # the release note frees p1 on the prefill
        Notifier().send(params["kvcake_notify"], ["p1"])
        deadline = time.monotonic() + 5
        frees: list[str] = []
        while not frees and time.monotonic() < deadline:
            frees = p.step().frees
        assert frees == ["p1"] and p.pending() == 0
        # no note: freed at the lease's end, counted as expired
        p.produced(req("p2", 11, {"do_remote_decode": True}), [1, 2])
        time.sleep(0.35)
        s = p.step()
        assert (s.frees, s.expired) == (["p2"], 1)
    finally:
        p.close()
        d.close()


class FakePool:
    def __init__(self, te: TransferEngine):
        self._client = SimpleNamespace(engine=te)

    def connected(self) -> Any:
        return self._client


def paged(seed: int, blocks: int = 8) -> tuple[PagedKV, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    kv = {f"layer{i}": torch.randn(blocks, 2, BS, 16, generator=g) for i in range(3)}
    return PagedKV(kv, blocks), kv


@pytest.fixture
def directory() -> Any:
    svc = DirectoryService("127.0.0.1", port=0)
    svc.start()
    yield svc.address
    svc.stop()


def run_pull(w: PdWorker, job: PullJob) -> tuple[set[str], set[int]]:
    w.step(PdStep(pulls=[job]))
    recv = wait_until(lambda: w.poll(set())[1], timeout=10, every_s=0.01, what="the pull finished")
    return recv, w.load_errors()


def test_worker_pulls_every_layer_straight_into_its_blocks(directory: str) -> None:
    cfg = ConnectorConfig(master="127.0.0.1:1", load_timeout_s=5.0)
    inbox = Inbox(LOG)
    with TransferEngine(directory) as ta, TransferEngine(directory) as tb:
        pa, kva = paged(1)
        pb, kvb = paged(2)
        a = PdWorker(FakePool(ta), Counters(), cfg, "eng-a", 0, LOG)  # type: ignore[arg-type]
        b = PdWorker(FakePool(tb), Counters(), cfg, "eng-b", 0, LOG)  # type: ignore[arg-type]
        a.attach(pa)
        b.attach(pb)
        remote = parse_remote(producer_params("eng-a", "ra", [5, 6, 2], 8, inbox.address))
        recv, errors = run_pull(b, PullJob("rb", remote, [5, 6, 2], [0, 1, 7]))
        assert recv == {"rb"} and not errors
        for name in kva:
            for lb, rb in zip([0, 1, 7], [5, 6, 2], strict=True):
                assert torch.equal(kvb[name][lb], kva[name][rb])
        deadline = time.monotonic() + 5
        while not (got := inbox.drain()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == {"ra"}  # the prefill is told its blocks can go
        assert b.counters.take()["pd_pull_blocks"] == 3
        # vLLM finished rb: its blocks are handed back once the read has ended (it has)
        assert b.poll({"rb"}) == ({"rb"}, set())
        # a prefill that is gone (nothing published under its engine id): all blocks fail
        gone = parse_remote(producer_params("eng-x", "rx", [1], 8, inbox.address))
        recv, errors = run_pull(b, PullJob("rc", gone, [1], [3]))
        assert recv == {"rc"} and errors == {3}
        # a prefill with another layout (its planes are not this size): refused
        a.close()
        a2 = PdWorker(FakePool(ta), Counters(), cfg, "eng-o", 0, LOG)  # type: ignore[arg-type]
        a2.attach(paged(3, blocks=4)[0])
        odd = parse_remote(producer_params("eng-o", "ro", [1], 8, inbox.address))
        recv, errors = run_pull(b, PullJob("rd", odd, [1], [4]))
        assert errors == {4}
        a2.close()
        b.close()
    inbox.close()


def test_pd_config_keys() -> None:
    from kvcake.core.errors import ConfigError

    cfg = ConnectorConfig.from_extra({"master": "127.0.0.1:1"})
    assert (cfg.pd_transport, cfg.pd_lease_s) == ("te", 120.0)
    assert ConnectorConfig.from_extra({"master": "h:1", "pd_transport": "pool"}).pd_transport == (
        "pool"
    )
    for bad in ({"pd_transport": "rdma"}, {"pd_lease_s": 0}, {"pd_lease_s": "soon"}):
        with pytest.raises(ConfigError):
            ConnectorConfig.from_extra({"master": "127.0.0.1:1", **bad})


def test_te_decode_rejected_before_scheduling_releases_the_prefill() -> None:
    """vLLM finishes a request it refused before scheduling (its
    ``notify_kv_transfer_request_rejected``: never matched): the prefill's blocks are
    released at once, not at the lease's end."""
    p = PdScheduler("eng-p", 16, BS, lease_s=30.0, log=LOG)
    d = PdScheduler("eng-d", 16, BS, lease_s=30.0, log=LOG, produce=False)
    try:
        _, params = p.produced(req("p1", 11, {"do_remote_decode": True}), [9, 4, 6])
        assert d.finished(req("d1", 11, dict(params))) is False
        deadline = time.monotonic() + 5
        frees: list[str] = []
        while not frees and time.monotonic() < deadline:
            frees = p.step().frees
        assert frees == ["p1"] and p.pending() == 0
        bad = {**params, "remote_block_ids": "x"}  # malformed: nothing to release, no error
        assert d.finished(req("d2", 11, bad)) is False
    finally:
        p.close()
        d.close()
