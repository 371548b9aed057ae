"""A nemesis client process: a seeded loop of puts, upserts, removes, gets and batch gets
through ``--master`` (``etcd://``), every call recorded in ``--out`` (JSON lines: an invoke
line before the call, a completion line after it, each flushed at once so a SIGKILL loses at
most the completion, which then counts as unknown). The process owns the keys
``<name>-k<j>`` (one writer per key, one call at a time) and reads every worker's keys.
``--final``: instead, read every key once (retrying errors that are not "not found") and
write the results to ``--out``.

``python -m benchmarks.nemesis.worker --master etcd://H:P/C --hostname ADDR --name w0
--incarnation 1 --seed 7 --workers w0,w1 --keys 16 --out FILE``
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from typing import IO, Any

from benchmarks.nemesis.values import decode, encode

from kvcake.store.client import Client
from kvcake.store.config import ClientConfig
from kvcake.store.errors import ObjectAlreadyExists, ObjectHasLease, ObjectNotFound
from kvcake.store.protocol import PutOptions

SIZES = (3000, 8192, 8192, 30000)  # repeated sizes: upserts often rewrite in place
MAX_SIZE = max(SIZES)
DEFINITE = (ObjectAlreadyExists, ObjectHasLease)  # refused before anything changed
STOP = False


def keys_of(workers: list[str], per: int) -> list[str]:
    return [f"{w}-k{j}" for w in workers for j in range(per)]


def replicas(key: str) -> int:
    """Half of the keys have two replicas (odd index), half one."""
    return 1 + int(key.rsplit("k", 1)[1]) % 2


class History:
    def __init__(self, fh: IO[str], proc: str):
        self.fh, self.proc, self.n = fh, proc, 0

    def invoke(self, f: str, keys: list[str], version: str = "") -> int:
        self.n += 1
        rec = {"type": "invoke", "p": self.proc, "i": self.n, "f": f, "k": keys, "v": version}
        self._write(rec)
        return self.n

    def done(self, i: int, outcome: str, **extra: Any) -> None:
        self._write({"type": outcome, "i": i, **extra})

    def _write(self, rec: dict[str, Any]) -> None:
        rec["t"] = time.monotonic()
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def _seen(value: Any) -> Any:
    if isinstance(value, ObjectNotFound):
        return None
    if isinstance(value, BaseException):
        return _err(value)
    return decode(value).as_list()


def write(c: Client, h: History, f: str, key: str, version: str, size: int) -> str:
    i = h.invoke(f, [key], version)
    opts = PutOptions(replica_num=replicas(key))
    try:
        if f == "put":
            c.put(key, encode(key, version, size), opts)
        else:
            c.upsert(key, encode(key, version, size), opts)
    except DEFINITE as exc:
        h.done(i, "fail", err=_err(exc))
        return "fail"
    except Exception as exc:  # unknown: it may or may not have taken effect
        h.done(i, "info", err=_err(exc))
        return "info"
    h.done(i, "ok", place=placement(c, key))
    return "ok"


def placement(c: Client, key: str) -> list[str] | None:
    """The nodes holding ``key``'s replicas (segment names are the nodes' --name)."""
    try:
        return sorted({r.segment for r in c.get_replica_desc(key).replicas})
    except Exception:
        return None


def remove(c: Client, h: History, key: str) -> str:
    i = h.invoke("remove", [key])
    try:
        c.remove(key)
    except ObjectNotFound as exc:  # the checker counts it unknown (a retry after a failover)
        h.done(i, "fail", err=_err(exc))
        return "absent"
    except DEFINITE as exc:
        h.done(i, "fail", err=_err(exc))
        return "fail"
    except Exception as exc:
        h.done(i, "info", err=_err(exc))
        return "info"
    h.done(i, "ok")
    return "ok"


def read(c: Client, h: History, keys: list[str]) -> None:
    i = h.invoke("get" if len(keys) == 1 else "batch_get", keys)
    try:
        if len(keys) == 1:
            try:
                got: list[Any] = [c.get(keys[0])]
            except ObjectNotFound as exc:
                got = [exc]
        else:
            got = list(c.batch_get(keys))
    except Exception as exc:
        h.done(i, "info", err=_err(exc))
        return
    seen = [_seen(v) for v in got]
    if any(isinstance(s, str) for s in seen) and len(keys) == 1:
        h.done(i, "info", err=seen[0])
        return
    h.done(i, "ok", read=seen)


def belief(f: str, outcome: str, before: bool | None) -> bool | None:
    """Whether the key exists after ``f`` ended with ``outcome`` (None: unknown). A refused
    put means it exists; a refused upsert or remove (leased) changed nothing."""
    if outcome == "info":
        return None
    if outcome in ("ok", "absent"):
        return f != "remove"
    return True if f == "put" else before


def run(c: Client, h: History, args: argparse.Namespace) -> None:
    rng = random.Random(f"{args.seed}/{args.name}/{args.incarnation}")
    mine = keys_of([args.name], args.keys)
    every = keys_of(args.workers.split(","), args.keys)
    there: dict[str, bool | None] = {}  # what this writer believes (None: unknown)
    seq = 0
    while not STOP:
        key, r = rng.choice(mine), rng.random()
        if r < 0.55:
            seq += 1
            version = f"{args.name}.{args.incarnation}.{seq}"
            exists = there.get(key)
            if exists is None:
                exists = rng.random() < 0.5
            if exists and rng.random() < 0.25:
                got, f = remove(c, h, key), "remove"
            else:
                f = "upsert" if exists else "put"
                got = write(c, h, f, key, version, rng.choice(SIZES))
            there[key] = belief(f, got, there.get(key))
        elif r < 0.85:
            read(c, h, [rng.choice(every)])
        else:
            read(c, h, rng.sample(every, min(4, len(every))))
        time.sleep(args.pace_s)


def final(c: Client, keys: list[str], out: IO[str], settle_s: float) -> None:
    """Every key once; errors other than "not found" (a node still re-registering after a
    failover, a leader being elected) are retried for up to ``settle_s``."""
    deadline = time.monotonic() + settle_s
    for key in keys:
        while True:
            try:
                got: Any = decode(c.get(key)).as_list()
            except ObjectNotFound:
                got = None
            except Exception as exc:
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                got = _err(exc)
            out.write(json.dumps({"k": key, "read": got}) + "\n")
            break


def connect(args: argparse.Namespace) -> Client:
    """A client, retried while the pool has no leader (a restart during a failover)."""
    cfg = ClientConfig(master=args.master, hostname=args.hostname,
                       rpc_timeout_s=args.rpc_timeout_s)  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        try:
            return Client(cfg)
        except Exception:  # no leader yet, its directory gone mid-way, ...
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def main() -> int:
    ap = argparse.ArgumentParser()
    for flag in ("--master", "--hostname", "--name", "--workers", "--out"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--incarnation", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keys", type=int, default=16)
    ap.add_argument("--pace-s", type=float, default=0.02)
    ap.add_argument("--rpc-timeout-s", type=float, default=3.0)
    ap.add_argument("--final", action="store_true")
    ap.add_argument("--settle-s", type=float, default=30.0)
    args = ap.parse_args()

    def stop(*_: object) -> None:
        global STOP
        STOP = True

    signal.signal(signal.SIGTERM, stop)
    c = connect(args)
    print("worker ready", flush=True)
    with open(args.out, "a") as out:
        if args.final:
            final(c, keys_of(args.workers.split(","), args.keys), out, args.settle_s)
        else:
            run(c, History(out, f"{args.name}.{args.incarnation}"), args)
    c.close()
    print("worker done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
