"""Structured objects over bundles: JSON metadata (with the members' field specs) as the bundle's
meta payload, one bundle payload per member; reads follow a ``StructuredObjectReadSpec``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcake.compat.mooncake._structured import _fields as F
from kvcake.compat.mooncake._structured._bundle import BundleStore, PutOptions
from kvcake.compat.mooncake._structured._manifest import decode_json, encode_json
from kvcake.compat.mooncake._structured._members import MemberReader
from kvcake.compat.mooncake._structured._types import (
    RemoteBundleRef,
    StructuredObjectPayload,
    StructuredObjectReadSpec,
    StructuredObjectResult,
)


class StructuredObjects:
    def __init__(self, bundles: BundleStore) -> None:
        self.bundles = bundles
        self.members = MemberReader(bundles.port)

    def put(
        self,
        payload: StructuredObjectPayload,
        partition: str,
        opts: PutOptions,
        pre_registered: Mapping[str, bool] | None = None,
    ) -> RemoteBundleRef:
        meta, payloads = F.encode_object(payload.metadata, payload.buffers)
        if opts.policy.copy_mode != "copy":
            pinned = frozenset(F.check_pre_registered(pre_registered, payloads))
            opts = PutOptions(opts.chunk_bytes, opts.policy, opts.config, pinned)
        blob = encode_json(meta, "structured metadata")
        return self.bundles.put(F.bytes_view(blob, "meta"), payloads, partition, opts)

    def read_metadata(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        blob = self.members.reader.read_all(manifest["meta"])
        return decode_json(blob, "structured metadata")

    def materialize(
        self, spec: StructuredObjectReadSpec, destinations: Mapping[str, Any] | None = None
    ) -> StructuredObjectResult:
        if spec.member_names is not None and not spec.member_names:
            raise ValueError("structured read spec selected no members")
        manifest = self.bundles.resolve(spec.ref)
        metadata = self.read_metadata(manifest)
        buffers = manifest["buffers"]
        names = list(buffers) if spec.member_names is None else list(spec.member_names)
        missing = [n for n in names if n not in buffers]
        if missing:
            raise KeyError(f"unknown bundle buffers: {missing}")
        specs, cuts, dests = F.field_specs(metadata), dict(spec.member_slices), destinations or {}
        objects = {
            name: self.members.read(
                name,
                buffers[name],
                specs.get(name, {"encoding": "bytes"}),
                cuts.get(name),
                dests.get(name),
            )
            for name in names
        }
        return StructuredObjectResult(metadata=dict(metadata), objects=objects)
