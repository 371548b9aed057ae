"""kill -9 each kind of process of a live cluster under client load (issue 12, section 4).

For each of proxy, prefill, decode, master and store-server: no client request hangs past its
timeout; every answer is either exactly the reference answer or a clear error (an HTTP error
with a JSON body, or an SSE error event; a refused or cut connection only when the proxy itself
was killed); the supervisor restarts the process and the cluster serves correct answers again.
The emulated backend's output depends only on token positions, so one healthy answer is the
reference for every prompt of the load (all have the same length). The times to recover are
printed (a benchmark's business, not asserted here beyond a generous deadline).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvcake.launch.launcher import Cluster
from kvcake.launch.supervisor import RestartPolicy, Supervisor
from tests.cluster import make_cluster
from tests.faults.load import CLIENT_TIMEOUT_S, PREFIXES, SUFFIX, Load, Result, one
from tests.waits import wait_until

# Lightest first; the proxy last (its restart drops every client connection).
VICTIMS = ["decode-0", "prefill-0", "store-0", "master", "proxy"]
RECOVERY_DEADLINE_S = 120.0
CLIENT_TTL_S = "3"  # the master drops a silent store-server after this (a short TTL: fast CI)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    mp = pytest.MonkeyPatch()
    mp.setenv("KVCAKE_MASTER_CLIENT_TTL_S", CLIENT_TTL_S)  # inherited by the master process
    run = Path(tmp_path_factory.mktemp("faults"))
    c = make_cluster(run, cluster={"prefill": 1, "decode": 1, "store_servers": 1,
                                   "store_size": "64MB"},
                     instance={"time_scale": 0.2, "kv_blocks": 256})  # fmt: skip
    c.supervisor = Supervisor(c, RestartPolicy(base_s=0.3, max_s=2.0))
    try:
        with c:
            yield c
    finally:
        mp.undo()
        from kvcake.transfer import cleanup_stale

        cleanup_stale()  # SIGKILLed processes could not remove their /dev/shm segments


def _probe(c: Cluster) -> Result:
    with httpx.Client(base_url=c.url, timeout=CLIENT_TIMEOUT_S) as http:
        return one(http, PREFIXES[0] + [7] * SUFFIX, stream=False)


@pytest.fixture(scope="module")
def reference(cluster: Cluster) -> Result:
    ref = _probe(cluster)
    assert ref.kind == "ok" and ref.tokens, ref
    return ref


def _correct(r: Result, ref: Result) -> bool:
    return r.text == ref.text and (r.tokens is None or r.tokens == ref.tokens)


def wait_serving(c: Cluster, ref: Result, deadline_s: float) -> float:
    t0 = time.monotonic()
    last: Result | None = None
    while time.monotonic() - t0 < deadline_s:
        try:
            last = _probe(c)
        except httpx.HTTPError as exc:
            last = Result("conn_error", 0.0, repr(exc))
        if last.kind == "ok":
            assert _correct(last, ref), f"a wrong answer after recovery: {last}"
            return time.monotonic() - t0
        time.sleep(0.3)
    raise AssertionError(f"the cluster did not serve again within {deadline_s} s: {last}")


@pytest.mark.slow
@pytest.mark.parametrize("victim", VICTIMS)
def test_kill9_under_load(cluster: Cluster, reference: Result, victim: str) -> None:
    wait_serving(cluster, reference, RECOVERY_DEADLINE_S)
    ch = cluster.child(victim)
    restarts = ch.restarts
    load = Load(cluster.url, threads=3, seed=VICTIMS.index(victim))
    load.start()
    wait_until(lambda: any(r.kind == "ok" for r in list(load.results)), timeout=60, every_s=0.2,
               what="answers flowing (kill under load)")  # fmt: skip
    time.sleep(1.0)
    assert ch.proc is not None
    os.kill(ch.proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    time.sleep(8.0)  # requests during the outage, the restart and after it
    results = load.stop()
    wait_serving(cluster, reference, RECOVERY_DEADLINE_S)
    kinds = Counter(r.kind for r in results)
    errs = [r.end for r in results if r.kind != "ok" and r.end > killed_at]
    back = [r.end for r in results if r.kind == "ok" and errs and r.end - r.seconds > min(errs)]
    serving = (min(back) if back else time.monotonic()) - killed_at
    outage = f"correct answers again {serving:.1f} s after the kill" if errs else "no errors"
    print(f"\n{victim}: {dict(kinds)}; {outage}; restarts {ch.restarts}")
    assert ch.restarts > restarts and ch.last_exit == "killed by SIGKILL"
    hung = [r for r in results if r.kind == "timeout" or r.seconds > CLIENT_TIMEOUT_S + 1]
    assert not hung, hung[:3]
    wrong = [
        r for r in results if r.kind == "wrong" or (r.kind == "ok" and not _correct(r, reference))
    ]
    assert not wrong, wrong[:3]
    if victim != "proxy":  # the proxy stayed up: every failure reached the client as an error
        cut = [r for r in results if r.kind == "conn_error"]
        assert not cut, cut[:3]
    assert kinds["ok"] > 0
