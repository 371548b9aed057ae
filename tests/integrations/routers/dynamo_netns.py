"""Run inside a private network namespace (tests/integrations/routers/test_dynamo_indexer.py):
a kvcake master with its vLLM-format stream, a store node, and Dynamo's standalone indexer
(which binds 0.0.0.0, hence the namespace) subscribed to the master. Writes, queries the
indexer's ``POST /query``, removes, queries again, fills the node until a block is evicted,
queries again; prints one JSON line of what it saw."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from typing import Any

from kvcake.core.hashing import block_key
from kvcake.store.client import Client
from kvcake.store.config import MasterConfig, StoreServerConfig
from kvcake.store.master_server import Master
from kvcake.store.server import StoreServer
from kvcake.store.vllm_events import announce, lineage

BLOCK = 16
TOKENS = list(range(500, 500 + 4 * BLOCK))  # four full blocks


def query(port: int, tokens: list[int]) -> Any:
    body = json.dumps({"token_ids": tokens, "model_name": "default"}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/query", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def matched(answer: Any) -> Any:
    """Worker 1's matched tokens in an indexer answer (None when it has none)."""
    return answer.get("instances", {}).get("1", {}).get("longest_matched")


def poll(port: int, tokens: list[int], want: Any, timeout: float = 20.0) -> Any:
    """The indexer's answer once ``want(answer)`` holds (or the last one after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = query(port, tokens)
        except OSError as exc:  # not listening yet
            got = {"error": str(exc)}
        if want(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def main(dynamo_python: str, http_port: int) -> None:
    # A fixed port (the namespace is private): a second master takes the first one's place.
    # Short leases: a block leased by the put or a read would not be evicted for 10 s.
    cfg = MasterConfig(
        port=0, http_port=-1, events_port=-1, ecosystem_events_port=5557, lease_ttl_s=0.2
    )
    m = Master(cfg)
    m.start()
    node = StoreServer(StoreServerConfig(master=m.rpc_address, segment_size=4 << 20, http_port=-1))
    node.start()
    ep = m.vllm_events.address
    idx = subprocess.Popen(
        [dynamo_python, "-m", "dynamo.indexer", "--workers", f"1={ep}",
         "--block-size", str(BLOCK), "--port", str(http_port), "--threads", "1"],
        stdout=subprocess.DEVNULL, stderr=None,  # to ours: the test shows it on failure
    )  # fmt: skip
    out: dict[str, Any] = {}
    try:
        out["before"] = poll(http_port, TOKENS, lambda a: "error" not in a)
        time.sleep(1.0)  # the indexer's SUB connects after its HTTP is up
        blocks = lineage(TOKENS, BLOCK)
        keys = [block_key("m", "f16", BLOCK, b.hash) for b in blocks]
        with Client(master=m.rpc_address) as c:
            announce(c, blocks)
            out["put"] = [r is None for r in c.batch_put(keys, [b"x" * 64] * len(keys))]
            out["stored"] = poll(http_port, TOKENS, lambda a: matched(a) == 64)
            c.remove(keys[2], force=True)
            out["after_remove"] = poll(http_port, TOKENS, lambda a: matched(a) == 32)
            # Memory pressure: 1 MiB fillers into the 4 MiB node until the master's LRU
            # eviction takes the (older) first block; its BlockRemoved empties the prefix.
            time.sleep(0.3)  # past every lease
            for i in range(8):  # (no reads meanwhile: a read leases the block again)
                c.batch_put([f"filler-{i}"], [b"f" * (1 << 20)])
            out["evicted"] = not c.is_exist(keys[0])
            out["after_evict"] = poll(http_port, TOKENS, lambda a: not matched(a))
        node.stop()
        m.stop()
        m = Master(cfg)  # a failover: the new publisher starts with AllBlocksCleared
        m.start()
        node = StoreServer(StoreServerConfig(master=m.rpc_address, http_port=-1))
        node.start()
        t0 = time.monotonic()
        out["after_failover"] = poll(http_port, TOKENS, lambda a: not matched(a))
        out["failover_s"] = round(time.monotonic() - t0, 2)
    finally:
        idx.terminate()
        idx.wait(5)
        node.stop()
        m.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
