"""Self-describing values: every stored value names its key and version and carries a digest
of both and of its payload, so a reader can tell a torn value (digest), another key's bytes
(key) and which write it saw (version) from the bytes alone.

Layout: ``NMS1 | u16 key_len | key | u16 ver_len | ver | u32 payload_len | 16-byte blake2b |
payload``; the digest covers key, version and payload.
"""

from __future__ import annotations

import hashlib
import random
import struct
from dataclasses import dataclass

MAGIC = b"NMS1"
DIGEST = 16


def _digest(key: bytes, ver: bytes, payload: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST)
    for part in (key, ver, payload):
        h.update(struct.pack("<I", len(part)))
        h.update(part)
    return h.digest()


def encode(key: str, version: str, size: int) -> bytes:
    """A value of ``size`` bytes in all (at least the header) for ``key`` at ``version``; the
    payload is seeded by both, so two versions of a key differ everywhere."""
    k, v = key.encode(), version.encode()
    head = 4 + 2 + len(k) + 2 + len(v) + 4 + DIGEST
    payload = random.Random(f"{key}\0{version}").randbytes(max(0, size - head))
    return b"".join(
        (MAGIC, struct.pack("<H", len(k)), k, struct.pack("<H", len(v)), v,
         struct.pack("<I", len(payload)), _digest(k, v, payload), payload)
    )  # fmt: skip


@dataclass(frozen=True)
class Seen:
    """What a read returned: the header's key and version, and whether the bytes are intact
    (magic, lengths and digest all right). A torn value may have no readable key/version."""

    key: str
    version: str
    intact: bool

    def as_list(self) -> list[object]:
        return [self.key, self.version, self.intact]


def decode(data: bytes | bytearray | memoryview) -> Seen:
    b = bytes(data)
    try:
        if b[:4] != MAGIC:
            return Seen("", "", False)
        (kl,) = struct.unpack_from("<H", b, 4)
        k = b[6 : 6 + kl]
        (vl,) = struct.unpack_from("<H", b, 6 + kl)
        v = b[8 + kl : 8 + kl + vl]
        pos = 8 + kl + vl
        (pl,) = struct.unpack_from("<I", b, pos)
        digest = b[pos + 4 : pos + 4 + DIGEST]
        payload = b[pos + 4 + DIGEST :]
        key, ver = k.decode(errors="replace"), v.decode(errors="replace")
        intact = len(payload) == pl and digest == _digest(k, v, payload)
        return Seen(key, ver, intact)
    except struct.error:
        return Seen("", "", False)
