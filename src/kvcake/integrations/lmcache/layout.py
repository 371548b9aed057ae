"""The layout header stored in front of every LMCache chunk kvcake holds, and its checks.

LMCache hands a remote connector raw bytes plus shapes/dtypes/format; the bytes alone cannot
say how to read them. So each pool object is ``header || payload``: the header names the
memory format and each group's dtype and shape. A reader whose engine expects another layout
gets a miss with an error (``LayoutMismatch``), never a reinterpretation of the bytes.
Pure Python (no torch, no LMCache) so it is tested in the project's own venv."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

MAGIC = b"KVCAKELM"
VERSION = 1
_PREFIX = struct.Struct("<8sHHQ")  # magic, version, json length, payload length
MAX_HEADER_JSON = 4096  # bounds what a corrupt object can make us parse


class LayoutMismatch(ValueError):
    """A stored chunk's layout differs from what the reader expects (or is unreadable)."""


class BadChunk(ValueError):
    """A call with a chunk whose bytes disagree with its own shapes and dtypes."""


@dataclass(frozen=True)
class Group:
    dtype: str  # torch's name, e.g. "torch.bfloat16"
    itemsize: int
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclass(frozen=True)
class Layout:
    fmt: str  # LMCache's MemoryFormat name, e.g. "KV_2LTD"
    groups: tuple[Group, ...]

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self.groups)


def encode(layout: Layout) -> bytes:
    doc = {
        "fmt": layout.fmt,
        "groups": [[g.dtype, g.itemsize, list(g.shape)] for g in layout.groups],
    }
    body = json.dumps(doc, separators=(",", ":")).encode()
    return _PREFIX.pack(MAGIC, VERSION, len(body), layout.nbytes) + body


def decode(blob: bytes | bytearray | memoryview) -> tuple[Layout, int]:
    """The layout at the start of ``blob`` and the offset of its payload. LayoutMismatch if
    the object was not written by this connector or its lengths disagree with ``blob``."""
    if len(blob) < _PREFIX.size:
        raise LayoutMismatch(f"object of {len(blob)} bytes has no kvcake LMCache header")
    magic, version, jlen, plen = _PREFIX.unpack_from(blob)
    if magic != MAGIC or version != VERSION:
        raise LayoutMismatch(f"not a kvcake LMCache chunk (magic {magic!r}, version {version})")
    if jlen > MAX_HEADER_JSON or _PREFIX.size + jlen + plen != len(blob):
        raise LayoutMismatch(f"header lengths {jlen}+{plen} disagree with {len(blob)} bytes")
    try:
        doc = json.loads(bytes(blob[_PREFIX.size : _PREFIX.size + jlen]))
        groups = tuple(Group(str(d), int(i), tuple(int(x) for x in s)) for d, i, s in doc["groups"])
        layout = Layout(str(doc["fmt"]), groups)
    except (ValueError, KeyError, TypeError) as e:
        raise LayoutMismatch(f"unreadable kvcake LMCache header: {e}") from e
    if layout.nbytes != plen:
        raise LayoutMismatch(f"header shapes make {layout.nbytes} bytes, payload is {plen}")
    return layout, _PREFIX.size + jlen


def token_dim(shape: tuple[int, ...]) -> int:
    # LMCache's own rule (RemoteConnector.reshape_partial_chunk): 4-D chunks keep tokens in
    # dim 2, the others in dim 0.
    return 2 if len(shape) == 4 else 0


def check(stored: Layout, expected: Layout) -> None:
    """Raise LayoutMismatch unless ``stored`` is ``expected`` or a partial chunk of it (fewer
    tokens along the token dimension, everything else equal)."""
    if stored.fmt != expected.fmt:
        raise LayoutMismatch(f"format {stored.fmt}, this engine expects {expected.fmt}")
    if len(stored.groups) != len(expected.groups):
        raise LayoutMismatch(f"{len(stored.groups)} groups, expected {len(expected.groups)}")
    for i, (s, e) in enumerate(zip(stored.groups, expected.groups, strict=True)):
        if s.dtype != e.dtype or s.itemsize != e.itemsize:
            raise LayoutMismatch(f"group {i}: dtype {s.dtype}, this engine expects {e.dtype}")
        t = token_dim(e.shape)
        if len(s.shape) != len(e.shape):
            raise LayoutMismatch(f"group {i}: shape {s.shape}, this engine expects {e.shape}")
        pairs = enumerate(zip(s.shape, e.shape, strict=True))
        others = all(a == b for k, (a, b) in pairs if k != t)
        if not (others and 0 < s.shape[t] <= e.shape[t]):
            raise LayoutMismatch(f"group {i}: shape {s.shape}, this engine expects {e.shape}")
