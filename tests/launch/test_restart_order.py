"""A cluster heals in any restart order (issue 31): one supervised default cluster (master with
its state dir, one store-server, prefill, decode, proxy; emulated backend), SIGKILLed 21 times
in a seeded order that makes every ordered pair of those five a pair of consecutive kills.
After each restart, requests succeed again within 15 s and none fails after that; a prefix
pooled before is still served from the pool when the pool survived."""

from __future__ import annotations

import itertools
import random
import time
from pathlib import Path

import httpx

from kvcake.core.hashing import block_hashes, block_key
from kvcake.launch.launcher import Cluster
from tests.cluster import make_cluster
from tests.waits import wait_until

PARTS = ["master", "store-0", "prefill-0", "decode-0", "proxy"]
HEAL_S = 15.0


def prefix(generation: int) -> list[int]:
    """3 blocks of 32 tokens, new for every generation of the pool (a killed store-server's
    blocks are gone, and a prefill that still holds a prefix does not pool it again)."""
    return [3000 + generation % 20000] + [300 + (i * 7) % 200 for i in range(95)]


def every_ordered_pair(parts: list[str], seed: int) -> list[str]:
    """A seeded Eulerian circuit of the complete directed graph on ``parts``: n(n-1)+1 kills
    whose consecutive pairs are every ordered pair once (Hierholzer's algorithm)."""
    rng = random.Random(seed)
    out = {p: rng.sample([q for q in parts if q != p], len(parts) - 1) for p in parts}
    stack, walk = [rng.choice(parts)], []
    while stack:
        if out[stack[-1]]:
            stack.append(out[stack[-1]].pop())
        else:
            walk.append(stack.pop())
    return walk[::-1]


def test_the_kill_order_covers_every_pair() -> None:
    seq = every_ordered_pair(PARTS, 31)
    assert len(seq) == 21
    pairs = list(itertools.pairwise(seq))
    assert len(set(pairs)) == 20 and all(a != b for a, b in pairs)
    assert every_ordered_pair(PARTS, 31) == seq  # seeded


def _ask(url: str, prompt: list[int], timeout: float = 10.0) -> httpx.Response:
    return httpx.post(url + "/v1/completions", timeout=timeout,
                      json={"prompt": prompt, "max_tokens": 3})  # fmt: skip


def _restarted(c: Cluster, name: str, old_pid: int, timeout: float = 60.0) -> float:
    """When ``name`` runs again under a new pid (time.monotonic())."""

    def since() -> float:
        proc = c.child(name).proc
        alive = proc is not None and proc.pid != old_pid and proc.poll() is None
        return time.monotonic() if alive else 0.0  # 0.0: not yet

    return wait_until(since, timeout=timeout, what=f"{name} restarted")


def _heal(url: str, since: float, step: int) -> float:
    """Seconds from the restart until a request succeeded (fails the test after HEAL_S)."""
    last = ""
    while time.monotonic() - since < HEAL_S:
        try:
            r = _ask(url, [1000 + step, 1001, 1002, 1003], timeout=HEAL_S)
            if r.status_code == 200:
                return time.monotonic() - since
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.2)
    raise AssertionError(f"no request succeeded within {HEAL_S} s: {last}")


def _pool_tokens(r: httpx.Response) -> int:
    usage = r.json()["usage"]["kvcake"]
    return sum(usage["pool_dram_tokens"].values())


def _in_pool(c: Cluster, tokens: list[int]) -> bool:
    """Does the store hold every full block of ``tokens`` (asked by a fresh client)?"""
    from kvcake.store.client import Client
    from kvcake.store.config import ClientConfig
    from kvcake.store.errors import RpcFailed

    kv = c.conf.kv
    keys = [str(block_key(kv.model, kv.dtype, kv.kv_block_tokens, h))
            for h in block_hashes(tokens, kv.kv_block_tokens)]  # fmt: skip
    client = wait_until(  # a restarted master may still be starting
        lambda: Client(ClientConfig(master=c.master_rpc, hostname="127.0.0.1")),
        timeout=HEAL_S, every_s=0.2, ignore=(RpcFailed,), what="the master back",
    )  # fmt: skip
    try:
        return all(client.batch_is_exist(keys))
    finally:
        client.close()


def _pool_new_prefix(c: Cluster, step: int) -> list[int]:
    """After the store-server's memory died: a prefix the pool holds again (a new one per
    try: a prefill that still holds a prefix locally does not pool it again)."""
    deadline = time.monotonic() + HEAL_S
    for attempt in range(1000):
        tokens = prefix(100 * step + attempt)
        assert _ask(c.url, tokens).status_code == 200
        time.sleep(0.5)  # the put runs in the background
        if _in_pool(c, tokens):
            return tokens
        assert time.monotonic() < deadline, "the restarted store-server never held a block"
    raise AssertionError("unreachable")


def test_restarts_in_every_order_heal(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, supervise=True, cluster={"store_servers": 1, "store_size": "64MB"})
    with c:
        pooled = _pool_new_prefix(c, 0)
        prefill_fresh = False  # has the prefill lost its local cache since the prefix was pooled?
        healed: list[float] = []
        for step, name in enumerate(every_ordered_pair(PARTS, 31)):
            old = c.child(name).proc
            assert old is not None
            old.kill()
            healed.append(_heal(c.url, _restarted(c, name, old.pid), step))
            for i in range(3):  # healed means healed: nothing fails afterwards
                r = _ask(c.url, [2000 + step, 3 + i, 5, 7, 11])
                assert r.status_code == 200, f"after killing {name} (step {step}): {r.text}"
            if name == "store-0":  # the pool's memory is gone: pool a new prefix
                pooled, prefill_fresh = _pool_new_prefix(c, step + 1), False
                continue
            # The pool survived, and so did what it knew (the master's state dir).
            assert _in_pool(c, pooled), f"after killing {name} (step {step})"
            prefill_fresh = prefill_fresh or name == "prefill-0"
            r = _ask(c.url, pooled)
            assert r.status_code == 200, r.text
            if prefill_fresh:  # no local copy: the prefix must come from the pool
                assert _pool_tokens(r) >= 64, (step, name, str(r.json()["usage"]["kvcake"]))
                prefill_fresh = False
        print("seconds from restart to the first success:", [round(h, 1) for h in healed])
    from kvcake.transfer import cleanup_stale

    cleanup_stale()  # the SIGKILLed processes could not remove their /dev/shm segments
