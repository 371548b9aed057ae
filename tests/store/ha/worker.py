"""A store client process for the HA tests: puts ``--count`` checksummed objects (seeded random
bytes, the CRC32 in the key) through ``--master`` and appends every acknowledged key to
``--out`` at once (so a killed master cannot make us forget an acknowledgement). Failed puts
are counted, not retried: only acknowledged objects are promised to survive. Every 8th put is
followed by a get of an earlier acknowledged object: a get that fails during a failover is
counted, one that returns other bytes ends the worker with exit code 1.

``python -m tests.store.ha.worker --master etcd://... --prefix c0 --count 2500 --out FILE``
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import zlib

from kvcake.core.errors import KvcakeError
from kvcake.store.client import Client


def value_for(rng: random.Random) -> bytes:
    return rng.randbytes(rng.randrange(256, 4097))


def key_for(prefix: str, i: int, value: bytes) -> str:
    return f"{prefix}/{i}/{zlib.crc32(value):08x}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline-s", type=float, default=240)
    args = ap.parse_args()
    rng = random.Random(args.prefix)
    end = time.monotonic() + args.deadline_s
    failed = get_failed = 0
    acked: list[str] = []
    with Client(master=args.master) as client, open(args.out, "a") as out:
        print("worker ready", flush=True)
        for i in range(args.count):
            if time.monotonic() > end:
                break
            value = value_for(rng)
            key = key_for(args.prefix, i, value)
            try:
                client.put(key, value)
            except KvcakeError as exc:
                failed += 1
                print(f"put {key} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            out.write(key + "\n")
            out.flush()
            acked.append(key)
            if i % 8 == 0:
                old = rng.choice(acked)
                try:
                    got = bytes(client.get(old))
                except KvcakeError:
                    get_failed += 1
                    continue
                if f"{zlib.crc32(got):08x}" != old.rsplit("/", 1)[1]:
                    print(f"get {old}: wrong bytes ({len(got)} B)", flush=True)
                    return 1
    print(f"worker done failed={failed} get_failed={get_failed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
