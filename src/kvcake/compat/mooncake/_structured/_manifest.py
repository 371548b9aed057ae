"""Bundle manifests: the JSON object that lists a bundle's store keys, and the checks that keep a
manifest read back from the store inside its own key namespace (a tampered manifest must never
make a read or a removal touch another object's keys).

Keys: ``{prefix}/{partition}/{uuid}/manifest``, ``.../meta`` and ``.../buffer/{name}``; a
payload split into several chunks stores ``{payload key}/chunk/{i}``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

Spec = dict[str, Any]


def check_chunk_bytes(chunk_bytes: int) -> int:
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    return chunk_bytes


def normalize_prefix(prefix: str) -> str:
    out = prefix.strip("/")
    if not out or any(ord(c) < 32 for c in out):
        raise ValueError("key_prefix must be a non-empty key prefix")
    return out


def check_segment(value: Any, name: str) -> None:
    """One path segment of a key: non-empty, no ``/``, no control characters."""
    bad = not isinstance(value, str) or not value or "/" in value
    if bad or any(ord(c) < 32 for c in value):
        raise ValueError(f"invalid bundle {name}: {value!r}")


def encode_json(value: Mapping[str, Any], label: str) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{label} must be JSON-serializable") from exc


def decode_json(blob: bytes, label: str) -> dict[str, Any]:
    value = json.loads(bytes(blob).decode())
    if not isinstance(value, dict):
        raise ValueError(f"{label} must decode to a dict")
    return value


def payload_keys(spec: Mapping[str, Any]) -> list[str]:
    return [chunk["key"] for chunk in spec["chunks"]]


def all_payload_keys(manifest: Mapping[str, Any]) -> list[str]:
    specs = [manifest["meta"], *manifest["buffers"].values()]
    return [key for spec in specs for key in payload_keys(spec)]


class Namespace:
    """The key namespace of one ``MooncakeBundleTransfer`` (its ``key_prefix``)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def base(self, object_id: str) -> str:
        return f"{self.prefix}/{object_id}"

    def manifest_key(self, manifest: Mapping[str, Any]) -> str:
        return f"{self.base(manifest['object_id'])}/manifest"

    def object_id_of(self, key: str) -> str | None:
        """The object id a bundle key belongs to (``None``: not one of ours)."""
        head = f"{self.prefix}/"
        if not key.startswith(head):
            return None
        rest = key[len(head) :]
        for tail in ("/manifest", "/meta"):
            if rest.endswith(tail):
                return rest[: -len(tail)]
        for marker in ("/meta/", "/buffer/"):
            at = rest.find(marker)
            if at > 0:
                return rest[:at]
        return None

    def validate(self, manifest: Mapping[str, Any]) -> None:
        if manifest.get("version") != 1 or manifest.get("layout") != "bundle":
            raise ValueError("invalid bundle manifest")
        object_id = manifest.get("object_id")
        if not isinstance(object_id, str):
            raise ValueError("bundle manifest object_id must be a string")
        owners = manifest.get("buffer_object_ids", [object_id])
        if not isinstance(owners, list) or not all(isinstance(o, str) for o in owners):
            raise ValueError("bundle manifest buffer_object_ids must be a list of strings")
        bases = [self.base(o) for o in owners]
        _check_spec(manifest.get("meta"), [self.base(object_id)])
        cleanup = manifest.get("cleanup_keys", [])
        if not isinstance(cleanup, list) or not all(_under(k, bases) for k in cleanup):
            raise ValueError("bundle manifest cleanup_keys are outside the bundle namespace")
        buffers = manifest.get("buffers")
        if not isinstance(buffers, dict):
            raise ValueError("bundle manifest buffers must be a dict")
        for name, spec in buffers.items():
            check_segment(name, "buffer name")
            _check_spec(spec, bases)


def _under(key: Any, bases: Sequence[str]) -> bool:
    return isinstance(key, str) and any(
        key == f"{b}/manifest" or key.startswith(f"{b}/") for b in bases
    )


def _check_spec(spec: Any, bases: Sequence[str]) -> None:
    if not isinstance(spec, dict):
        raise ValueError("bundle payload spec must be a dict")
    key = spec.get("key")
    if not isinstance(key, str) or not any(key.startswith(f"{b}/") for b in bases):
        raise ValueError("bundle payload key is outside the bundle namespace")
    total = int(spec.get("bytes", -1))
    if total < 0:
        raise ValueError("bundle payload bytes must be non-negative")
    chunks = spec.get("chunks")
    if not isinstance(chunks, list) or (total and not chunks):
        raise ValueError("bundle payload chunks are invalid")
    seen: set[str] = set()
    for chunk in chunks:
        if not isinstance(chunk, dict):
            raise ValueError("bundle chunk must be a dict")
        ckey, size = chunk.get("key"), int(chunk.get("bytes", -1))
        if not isinstance(ckey, str) or (ckey != key and not ckey.startswith(f"{key}/")):
            raise ValueError("bundle chunk key is outside the payload namespace")
        if ckey in seen:
            raise ValueError("bundle chunk keys must be unique")
        if size < 0:
            raise ValueError("bundle chunk bytes must be non-negative")
        seen.add(ckey)
    found = sum(int(c["bytes"]) for c in chunks)
    if found != total:
        raise ValueError(f"bundle payload chunks total {found} bytes, expected {total}")
