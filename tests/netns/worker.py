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
