"""Store client work run *on the client host* (``python -c`` under ``ip netns exec``): prints
one JSON line. Kept importable without the tests package (the harness runs it by source)."""

PUT = r"""
import hashlib, json, os, random, sys
from kvcake.store.client import Client
from kvcake.store.config import ClientConfig
from kvcake.store.protocol import PutOptions
master, host, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(15)
c = Client(ClientConfig(master=master, hostname=host, protocol="tcp", rpc_timeout_s=10))
where = {}
for i in range(n):
    v = rng.randbytes(64 * 1024)
    k = f"obj-{i}-{hashlib.sha256(v).hexdigest()[:16]}"
    c.put(k, v, PutOptions(replica_num=1))
    where[k] = [r.segment for r in c.get_replica_desc(k).replicas]
c.close()
print(json.dumps(where))
"""

CHECK = r"""
import hashlib, json, sys, time
from kvcake.store.client import Client
from kvcake.store.config import ClientConfig
from kvcake.store.errors import StoreError
master, host, lost_seg, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
where = json.loads(sys.stdin.read())
c = Client(ClientConfig(master=master, hostname=host, protocol="tcp", rpc_timeout_s=10))
lost = [k for k, s in where.items() if lost_seg in s]
out = {"first_get_s": None, "first_get": "", "gone_after_s": None, "intact": 0, "bad": []}
t = time.monotonic()
try:  # right after the cut: the node is silent, not reset; the read must give up, not hang
    c.get(lost[0])
    out["first_get"] = "ok"
except StoreError as exc:
    out["first_get"] = type(exc).__name__
out["first_get_s"] = time.monotonic() - t
deadline = t + ttl + 30
while time.monotonic() < deadline:
    if not any(c.batch_is_exist(lost)):
        out["gone_after_s"] = time.monotonic() - t
        break
    time.sleep(0.25)
for k, segs in where.items():
    if k in lost:
        continue
    try:
        v = c.get(k)
        ok = hashlib.sha256(bytes(v)).hexdigest()[:16] == k.rsplit("-", 1)[1]
    except StoreError as exc:
        ok = False
    if ok:
        out["intact"] += 1
    else:
        out["bad"].append(k)
c.close()
print(json.dumps(out))
"""

EVENTS = r"""
import json, sys, time
import zmq
from kvcake.core.api import STORE_EVENTS_TOPIC
from kvcake.core.auth import resolve
from kvcake.core.zmq_curve import secure_subscriber
from kvcake.store import protocol as P
from kvcake.store.client import Client
from kvcake.store.config import ClientConfig
from kvcake.store.events import BATCH_DECODER
master, host = sys.argv[1], sys.argv[2]
c = Client(ClientConfig(master=master, hostname=host, protocol="tcp", rpc_timeout_s=10))
address = str(c.conn.call(P.Heartbeat("", "netns-events")).events)
ctx = zmq.Context()
socks = {}
for name in ("secret", "plain"):
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    if name == "secret":  # the cluster's secret (KVCAKE_AUTH_SECRET), as the proxy does
        secure_subscriber(s, resolve(None))
    s.connect(address)
    socks[name] = s
time.sleep(0.5)
c.put("netns-events/probe", b"x" * 1024)
got = {name: [] for name in socks}
deadline = time.monotonic() + 10
while time.monotonic() < deadline and "netns-events/probe" not in got["secret"]:
    for name, s in socks.items():
        while s.poll(50):
            topic, payload = s.recv_multipart()
            if topic == STORE_EVENTS_TOPIC:
                got[name] += [k for e in BATCH_DECODER.decode(payload) for k in e.keys]
            else:
                got[name].append("tick")
c.remove("netns-events/probe", force=True)
c.close()
print(json.dumps({"address": address, **got}))
"""
