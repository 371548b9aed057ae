"""kvcake's ``native_plugin`` for ``lmcache server`` on its own, against a real kvcake pool (the
project's venv: the plugin imports nothing of LMCache): what LMCache's adapter relies on when
things go wrong -- one completion per submitted id, never a blocking submit, a worker that
survives a bad batch, and a store that says which keys it could not store."""

from __future__ import annotations

import select
import threading
from collections.abc import Iterator

import pytest

from kvcake.integrations.lmcache.l2 import KvcakeL2Client
from kvcake.store.errors import ObjectNotFound
from tests.store.procs import Proc

Completion = tuple[int, bool, str, "list[bool] | None"]


@pytest.fixture
def l2(pool: tuple[Proc, Proc]) -> Iterator[KvcakeL2Client]:
    client = KvcakeL2Client(pool[0].info["rpc"], max_pending=2)
    yield client
    client.close()


def wait(client: KvcakeL2Client, fids: set[int], timeout_s: float = 30) -> dict[int, Completion]:
    """Poll the event fd as LMCache's adapter does until every id in ``fids`` completed."""
    got: dict[int, Completion] = {}
    poller = select.poll()
    poller.register(client.event_fd(), select.POLLIN)
    while not fids <= got.keys():
        assert poller.poll(int(timeout_s * 1000)), f"no completion for {fids - got.keys()}"
        got.update((c[0], c) for c in client.drain_completions())
    return got


def test_a_bad_batch_fails_and_the_worker_keeps_serving(l2: KvcakeL2Client) -> None:
    bad = l2.submit_batch_exists([b"not a str"])  # type: ignore[list-item]
    good = l2.submit_batch_exists(["absent-key"])
    done = wait(l2, {bad, good})
    assert done[bad][1] is False and "TypeError" in done[bad][2], done[bad]
    assert done[good] == (good, True, "", [False])
    assert l2.errors["internal"] == 1


def test_a_full_queue_refuses_at_once(l2: KvcakeL2Client) -> None:
    started, gate = threading.Event(), threading.Event()
    stalled = l2._submit(lambda: [started.set() is None and gate.wait(30)])  # holds the worker
    assert started.wait(10)  # the worker is busy: from here on the queue fills up
    queued = [l2.submit_batch_exists(["k"]) for _ in range(2)]  # max_pending = 2
    refused = l2.submit_batch_exists(["k"])  # returns at once, with a failed completion
    assert wait(l2, {refused})[refused] == (refused, False, "kvcake L2: queue full", None)
    assert l2.errors["queue_full"] == 1
    gate.set()
    done = wait(l2, {stalled, *queued})
    assert all(done[f][1] for f in (stalled, *queued)), done


def test_a_store_names_the_keys_it_could_not_store(l2: KvcakeL2Client) -> None:
    small, huge = bytearray(b"x" * 4096), bytearray(80 << 20)  # the node has 64 MB
    # (huge first: the pool's attempt to make room for it may evict what is already there)
    fid = l2.submit_batch_set(["huge", "small"], [huge, small])
    done = wait(l2, {fid}, 60)[fid]
    assert done[1] is False and done[2] == "1 of 2 keys failed" and done[3] == [False, True]
    assert l2.errors["store_error"] == 1
    back = bytearray(4096)
    get = l2.submit_batch_get(["small"], [back])
    assert wait(l2, {get})[get][3] == [True] and back == small, l2.errors
    with pytest.raises(ObjectNotFound):
        l2.client.get("lmcache-l2/huge")


def test_a_batch_get_reads_ours_and_leaves_the_rest_untouched(l2: KvcakeL2Client) -> None:
    value = bytearray(range(256)) * 16
    wait(l2, {l2.submit_batch_set(["ours"], [value])})
    l2.client.put("lmcache-l2/foreign", b"\x01" * (16 + len(value)))  # no KVCAKEL2 header
    l2.client.put("lmcache-l2/tiny", b"\x02" * 5)  # shorter than a header
    names = ["ours", "absent", "foreign", "tiny"]
    bufs = [bytearray(b"\xee" * len(value)) for _ in names]
    fid = l2.submit_batch_get(names, bufs)
    assert wait(l2, {fid})[fid] == (fid, True, "", [True, False, False, False])
    assert bufs[0] == value
    assert all(b == b"\xee" * len(value) for b in bufs[1:])  # misses write nothing
    assert l2.errors["size_mismatch"] == 2 and l2.errors["store_error"] == 0
